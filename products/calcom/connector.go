package calcom

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Manifest identity.
const (
	AgentID = "agent:cal-diy"
	// Profile is the connector profile the manifest declares beside the
	// native HTTP profile.
	Profile = "aip.connector.cal_diy.v1"
	// CredentialIssuer is the issuer of the deployment's credential.
	CredentialIssuer = "cal_diy_deployment"
)

// Connector is the Cal.diy adapter: a hostsdk.Connector, HealthChecker
// and (with webhook secrets) RouteProvider.
type Connector struct {
	cfg    Config
	client *provider.Client
}

var (
	_ hostsdk.Connector     = (*Connector)(nil)
	_ hostsdk.HealthChecker = (*Connector)(nil)
	_ hostsdk.RouteProvider = (*Connector)(nil)
)

var outputSchema = json.RawMessage(`{
  "type": "object",
  "description": "the Cal.diy answer as it was sent: status (success) and data, with pagination on lists",
  "properties": {"status": {"type": "string"}, "data": {}},
  "required": ["status"]
}`)

func contract(o *operation) *aip.CapabilityContract {
	c := &aip.CapabilityContract{
		SideEffects: []aip.SideEffect{"read", "external_network"},
		Idempotency: aip.IdempotencyContract{
			Requirement:       "optional",
			CollisionBehavior: "return_original_result",
			KeyScope:          aip.ScopeAction,
		},
		Execution: aip.ExecutionContract{
			SupportsSync: true, SupportsRetry: true,
			ExpectedCompletion: aip.CompletionSync, RetrySafety: "safe",
		},
		Data: aip.DataContract{Sensitivity: aip.SensitivityConfidential, ContainsPII: true},
		Credentials: &aip.CredentialsContract{Required: true, AcceptedIssuers: []string{CredentialIssuer},
			RequiredScopes: []string{"cal_diy:" + o.Suffix}},
	}
	if o.Mutation {
		c.SideEffects = []aip.SideEffect{"write", "send_message", "external_network"}
		c.Idempotency.Requirement = "required"
		// The provider has no idempotency of its own: an unknown outcome is
		// journaled and never retried by the host.
		c.Execution.SupportsRetry = false
		c.Execution.RetrySafety = "unsafe"
		c.Compensation = &aip.CompensationContract{Mode: "rollback_not_supported"}
	}
	return c
}

// Manifest implements hostsdk.Connector.
func (c *Connector) Manifest(context.Context, hostsdk.TenantContext) (*aip.Manifest, error) {
	caps := make([]aip.Capability, 0, len(operations))
	for _, o := range operations {
		capa := aip.Capability{
			ID: o.ID(), Name: o.Name, Kind: aip.KindTool, Description: o.Description,
			InputSchema: o.inputSchema(), OutputSchema: outputSchema,
			Risk: o.Risk, Stability: aip.StabilityStable, Contract: contract(o),
		}
		caps = append(caps, capa)
	}
	m := &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: AgentID, Kind: aip.PrincipalAgent, DisplayName: "Cal.diy connector"},
		Profiles:        []string{aip.NativeHTTPProfile, Profile},
		Capabilities:    caps,
		Security: json.RawMessage(`{"api_auth":["bearer"],"credential_material_in_protocol":false,` +
			`"webhook_hmac":"sha256_hex_exact_raw_body","provider_idempotency":false,` +
			`"webhook_subscriber_urls":"configured_https_prefixes_only","webhook_secrets_in_output":false}`),
		Governance: json.RawMessage(`{"mutations_require_approval":false,"uncertain_mutations_require_reconciliation":true,` +
			`"unresolved_provider_outcome":"operator_evidence_required"}`),
		Limits: json.RawMessage(fmt.Sprintf(`{"webhook_max_body_bytes":%d}`, WebhookMaxBody)),
	}
	if len(c.cfg.WebhookSecrets) > 0 {
		m.Channels = []json.RawMessage{json.RawMessage(`{"id":"` + WebhookChannel + `","system":"cal-diy",` +
			`"direction":"inbound","description":"verified Cal.diy webhook deliveries (kind cal_diy.<trigger event>)"}`)}
	}
	return m, nil
}

// Handle implements hostsdk.Connector.
func (c *Connector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	o, ok := operationsByID[call.Action.CapabilityID]
	if !ok {
		return nil, fmt.Errorf("calcom: unknown capability %s", call.Action.CapabilityID)
	}
	// Cal.diy keeps its data in PostgreSQL through Prisma, which cannot
	// hold U+0000 nor compare with it, and API v2 answers the database's
	// refusal with a 500 (see the package comment): refused before any
	// request.
	if err := provider.RefuseNUL(hostsdk.CodeInputInvalid, "Cal.diy", call); err != nil {
		return nil, err
	}
	req, err := o.build(call.Action.Input)
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	h.Set("x-aip-action-id", call.Action.ID)
	if call.Tenant.TenantID != "" {
		h.Set("x-aip-tenant-id", call.Tenant.TenantID)
	}
	if o.Mutation && call.IdempotencyKey != "" {
		// The provider client never lets net/http resend a mutation,
		// whatever its headers (provider.neverResent).
		h.Set("Idempotency-Key", provider.CallIdempotencyKey(call))
	}
	if o.Version != "" {
		h.Set("cal-api-version", o.Version)
	}
	if o.Webhook && req.body != nil {
		if pe := c.prepareWebhook(req.body, o.Method == http.MethodPatch); pe != nil {
			return &aip.ActionResult{ActionID: call.Action.ID, Status: aip.ResultFailed, Error: pe}, nil
		}
	}
	preq := provider.Request{Method: o.Method, Path: req.path, Query: req.query, Header: h}
	if req.body != nil {
		preq.JSON = req.body
	}
	out, err := c.call(ctx, preq)
	if err == nil && o.Webhook {
		if out, err = redactSecrets(out); err != nil {
			err = &provider.Error{Product: c.client.Product(), Method: preq.Method, Path: preq.Path,
				Message: "answered with a webhook that could not be read", MayHaveApplied: true}
		}
	}
	if err != nil && o.Series {
		err = c.seriesError(ctx, call, req.body, err)
	}
	if err != nil {
		return provider.Result(call, err, o.Mutation)
	}
	return &aip.ActionResult{ActionID: call.Action.ID, Status: aip.ResultCompleted, Output: out}, nil
}

// call sends req and returns the answer's JSON object. A 2xx body that
// is empty or not a JSON object, or whose status is not "success"
// ("error", another value, none), is a bad response that may have been
// applied: Cal.diy took the request and
// answered it, and the answer does not say what became of it, so a
// mutation is outcome_unknown (a failed result would invite the caller to
// book or cancel again) and a read a failed provider.bad_response.
func (c *Connector) call(ctx context.Context, req provider.Request) (json.RawMessage, error) {
	resp, err := c.client.Do(ctx, req)
	if err != nil {
		var pe *provider.Error
		if errors.As(err, &pe) && pe.Status == http.StatusRequestTimeout {
			// Cal.diy answers 408 when the work it started took too long
			// (its tRPC exception filter maps TIMEOUT to 408), not only
			// when the request did not arrive in time: a mutation may
			// have been applied.
			pe.MayHaveApplied = true
		}
		return nil, err
	}
	body := bytes.TrimSpace(resp.Body)
	if len(body) == 0 {
		// Every answer the document describes has a JSON body with its
		// status: an empty one (a proxy's 200, a 204) says nothing of
		// what became of the request.
		return nil, &provider.Error{Product: c.client.Product(), Method: req.Method, Path: req.Path, Status: resp.Status,
			Message: "answered with an empty body, not the JSON envelope the document describes", MayHaveApplied: true}
	}
	var env struct {
		Status string          `json:"status"`
		Error  json.RawMessage `json:"error"`
	}
	if body[0] != '{' || json.Unmarshal(body, &env) != nil {
		return nil, &provider.Error{Product: c.client.Product(), Method: req.Method, Path: req.Path, Status: resp.Status,
			Message: "answered with a body that is not a JSON object", MayHaveApplied: true}
	}
	switch env.Status {
	case "success":
	case "error":
		msg := "answered status error"
		var e struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}
		if json.Unmarshal(env.Error, &e) == nil && (e.Message != "" || e.Code != "") {
			msg = fmt.Sprintf("%s: %s %s", msg, e.Code, e.Message)
		}
		return nil, &provider.Error{Product: c.client.Product(), Method: req.Method, Path: req.Path, Status: resp.Status,
			Message: c.client.Redacted(msg), MayHaveApplied: true}
	default:
		return nil, &provider.Error{Product: c.client.Product(), Method: req.Method, Path: req.Path, Status: resp.Status,
			Message: c.client.Redacted(fmt.Sprintf("answered status %q, not success", env.Status)), MayHaveApplied: true}
	}
	return json.RawMessage(body), nil
}

// CheckHealth implements hostsdk.HealthChecker: GET /v2/me, which needs a
// valid API key.
func (c *Connector) CheckHealth(ctx context.Context) error {
	_, err := c.call(ctx, provider.Request{Method: http.MethodGet, Path: "/v2/me"})
	return err
}
