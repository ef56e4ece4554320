-- 0003_route_take: the abort of a new route's final batch.
--
-- A new route reads its ranked candidates without locking them; its last
-- round trip locks the first candidate no other transaction holds (FOR
-- UPDATE SKIP LOCKED) that is still eligible, counts the assignment on it,
-- inserts the route, reserves the admission counters and commits. When no
-- candidate could be taken, replica_taken aborts the transaction with
-- SQLSTATE AIP02, so the statements queued behind it (the reservations and
-- the COMMIT) never run; the registry then reads again and retries a
-- bounded number of times.

CREATE FUNCTION aip_registry.replica_taken() RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'no listed replica could be taken: each is row-locked by another transaction or no longer eligible'
        USING ERRCODE = 'AIP02';
END
$$;
