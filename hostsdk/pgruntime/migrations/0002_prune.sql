-- Pruning old actions (journal.Journal.PruneActions). A namespace's prune
-- horizon is the latest completion time of any action pruned from it: an
-- action that may have been received before it may be gone, so it is never
-- created again (journal.ErrPruned).

CREATE INDEX aip_runtime_actions_by_completion ON aip_runtime_actions (journal_ns, completed_at, seq)
	WHERE completed_at IS NOT NULL;

CREATE TABLE aip_runtime_prune_horizons (
	journal_ns   text        PRIMARY KEY,
	completed_at timestamptz NOT NULL
);

-- aip_runtime_create_action journals a new action in status p_status
-- (received or running), first claiming message p_message_id until
-- p_message_expires when it is not NULL (claimed is false, and nothing is
-- written, for an unexpired replay). created is false when the action ID
-- is journaled already. A created action that may have been received
-- before the prune horizon (p_assigned NULL or not after it) raises
-- SQLSTATE AJ001, which rolls back the whole call: the claim too.
--
-- It is a function because of the order of its reads: the horizon is read
-- by a statement of its own after the insert, so with a fresh snapshot
-- (READ COMMITTED). An insert that waited for a concurrent prune deleting
-- the same action ID therefore sees that prune's horizon, which commits
-- with the deletion; a horizon read in the inserting statement would be
-- older than the wait.
CREATE FUNCTION aip_runtime_create_action(
	p_ns text, p_message_id text, p_message_expires timestamptz, p_now timestamptz,
	p_action_id text, p_capability_id text, p_tenant_id text, p_idempotency_key text,
	p_input_digest text, p_fence_token text, p_action_message_id text, p_received timestamptz,
	p_status text, p_assigned timestamptz,
	OUT claimed boolean, OUT created boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
	horizon timestamptz;
BEGIN
	claimed := true;
	created := false;
	IF p_message_id IS NOT NULL THEN
		INSERT INTO aip_runtime_messages (journal_ns, message_id, expires_at)
		VALUES (p_ns, p_message_id, p_message_expires)
		ON CONFLICT (journal_ns, message_id) DO UPDATE SET expires_at = EXCLUDED.expires_at
		WHERE aip_runtime_messages.expires_at <= p_now;
		IF NOT FOUND THEN
			claimed := false;
			RETURN;
		END IF;
	END IF;
	INSERT INTO aip_runtime_actions (journal_ns, action_id, capability_id, tenant_id,
		idempotency_key, input_digest, fence_token, message_id, status, result, detail,
		received_at, started_at, updated_at, completed_at)
	VALUES (p_ns, p_action_id, p_capability_id, p_tenant_id, p_idempotency_key, p_input_digest,
		p_fence_token, p_action_message_id, p_status, NULL, '', p_received,
		CASE WHEN p_status = 'running' THEN p_received END, p_received, NULL)
	ON CONFLICT (journal_ns, action_id) DO NOTHING;
	IF NOT FOUND THEN
		RETURN;
	END IF;
	created := true;
	SELECT h.completed_at INTO horizon FROM aip_runtime_prune_horizons h WHERE h.journal_ns = p_ns;
	IF horizon IS NOT NULL AND (p_assigned IS NULL OR p_assigned <= horizon) THEN
		RAISE EXCEPTION 'action % may have been received before the prune horizon %', p_action_id, horizon
			USING ERRCODE = 'AJ001';
	END IF;
END
$$;
