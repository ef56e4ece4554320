package calcom

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/aipfleet/aipfleet/aip"
)

// MaxSubscriberPrefixes bounds the entries of
// --cal-diy-webhook-subscriber-prefixes.
const MaxSubscriberPrefixes = 32

// CodeSubscriberURLNotAllowed is the error code of a webhook or event
// type webhook create or update whose subscriber URL is not an allowed prefix followed
// by a subscription ID. Nothing is sent to Cal.diy.
const CodeSubscriberURLNotAllowed = "cal_diy.subscriber_url_not_allowed"

// CodePayloadTemplateRefused is the error code of a webhook or event type
// webhook create or update that gives a payload_template for a
// subscription this connector receives (it holds its signing secret): the
// webhook route reads Cal.diy's default payload only. Nothing is sent.
const CodePayloadTemplateRefused = "cal_diy.payload_template_refused"

// checkSubscriberPrefix validates one allowed subscriber URL prefix: an
// absolute https URL in canonical form, without user information, query
// or fragment, whose path ends with "/" (so that what follows it cannot
// change the host or escape the path).
func checkSubscriberPrefix(p string) error {
	u, err := url.Parse(p)
	switch {
	case err != nil:
		return fmt.Errorf("prefix %q is not a URL: %v", p, err)
	case u.Scheme != "https":
		return fmt.Errorf("prefix %q must be an https URL", p)
	case u.Host == "" || u.Opaque != "":
		return fmt.Errorf("prefix %q has no host", p)
	case u.User != nil:
		return fmt.Errorf("prefix %q must not carry user information", p)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.ContainsAny(p, "?#"):
		return fmt.Errorf("prefix %q must not have a query or fragment", p)
	case !strings.HasSuffix(u.Path, "/"):
		return fmt.Errorf("prefix %q must end with a path that ends with / (e.g. https://aip.example.com/webhooks/cal-diy/)", p)
	case u.String() != p || strings.ContainsAny(p, "% \t\\") || strings.Contains(u.Path, "/../") || strings.Contains(u.Path, "/./"):
		return fmt.Errorf("prefix %q must be written in canonical form, without escapes or dot segments", p)
	}
	return nil
}

// parseSubscriberPrefixes reads --cal-diy-webhook-subscriber-prefixes: a
// comma list; empty is none (every webhook create, and every update
// that sets a subscriber URL, is refused).
func parseSubscriberPrefixes(raw string) ([]string, error) {
	if strings.TrimSpace(raw) == "" {
		return nil, nil
	}
	var out []string
	for _, p := range strings.Split(raw, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			return nil, fmt.Errorf("--%s (AIP_CAL_DIY_WEBHOOK_SUBSCRIBER_PREFIXES): empty entry in %q", flagSubscriberPrefixes, raw)
		}
		out = append(out, p)
	}
	return out, nil
}

// subscriber checks a subscriber URL against the allowed prefixes and
// returns its subscription ID: the URL must be exactly an allowed prefix
// followed by an ID with the webhook route's syntax.
func (c *Connector) subscriber(raw string) (string, bool) {
	for _, p := range c.cfg.SubscriberPrefixes {
		if id, ok := strings.CutPrefix(raw, p); ok && subscriptionRE.MatchString(id) {
			return id, true
		}
	}
	return "", false
}

// prepareWebhook applies the webhook policy to a webhook create or
// update body (user or event type webhook): a subscriber URL must be
// allowed (an update without one may only set active false), and when the
// connector holds the signing secret of its subscription that secret is
// sent, so that deliveries verify at POST /webhooks/cal-diy/{id}; an
// update (PATCH, which keeps what it does not name) pointing a webhook at
// such a subscription clears the webhook's payload template. Every
// trigger is taken, MEETING_STARTED and MEETING_ENDED included (the
// route reads the shape Cal.diy's scheduler sends them in:
// scheduledTriggers). It returns a protocol error when the URL is not
// allowed or a payload template is given for such a subscription.
func (c *Connector) prepareWebhook(body map[string]any, update bool) *aip.ProtocolError {
	raw, ok := body["subscriberUrl"]
	if !ok {
		// An update that keeps the webhook's URL: that URL may be anything
		// (set outside this connector), so the update may only switch the
		// webhook off; changing its triggers or template, or switching it
		// on, would send more to a URL the policy never allowed.
		if active, set := body["active"]; len(body) == 1 && set && active == false {
			return nil
		}
		return &aip.ProtocolError{Code: CodeSubscriberURLNotAllowed, Category: aip.CategoryPolicy, Retryable: new(false),
			Message: "an update that does not give an allowed subscriber URL (subscriber_url) may only switch the webhook off (active false)"}
	}
	s, _ := raw.(string)
	id, ok := c.subscriber(s)
	if !ok {
		msg := "the subscriber URL is not an allowed prefix followed by a subscription ID"
		if len(c.cfg.SubscriberPrefixes) == 0 {
			msg = "no subscriber URL prefixes are configured (--" + flagSubscriberPrefixes + "), so webhooks cannot be pointed anywhere"
		}
		return &aip.ProtocolError{Code: CodeSubscriberURLNotAllowed, Category: aip.CategoryPolicy, Retryable: new(false), Message: msg}
	}
	if secret, ok := c.cfg.WebhookSecrets[id]; ok {
		// This connector receives the subscription's deliveries and reads
		// Cal.diy's own payload ({triggerEvent, createdAt, payload}); a
		// template replaces it, so every delivery would be refused (but
		// MEETING_STARTED and MEETING_ENDED, which Cal.diy's scheduler
		// sends as {triggerEvent, ...booking} whatever the template).
		if tpl, _ := body["payloadTemplate"].(string); tpl != "" {
			return &aip.ProtocolError{Code: CodePayloadTemplateRefused, Category: aip.CategoryPolicy, Retryable: new(false),
				Message: fmt.Sprintf("subscription %s is delivered to this connector (it holds its signing secret), which reads Cal.diy's default payload; a payload_template would make every delivery unreadable: leave payload_template out", id)}
		}
		if _, given := body["payloadTemplate"]; update && !given {
			// The webhook may carry a template set while it pointed
			// elsewhere; kept, it would make every delivery here
			// unreadable. An empty template is Cal.diy's default payload.
			body["payloadTemplate"] = ""
		}
		body["secret"] = secret.Reveal()
	}
	return nil
}

// redactSecrets leaves the secret member out of a webhook answer's data
// (an object, or an array of objects): signing secrets are credentials
// and never part of an action's output.
func redactSecrets(raw json.RawMessage) (json.RawMessage, error) {
	var env map[string]json.RawMessage
	if err := json.Unmarshal(raw, &env); err != nil {
		return nil, err
	}
	data, ok := env["data"]
	if !ok {
		return raw, nil
	}
	strip := func(item json.RawMessage) (json.RawMessage, error) {
		var obj map[string]json.RawMessage
		if json.Unmarshal(item, &obj) != nil || obj == nil {
			return item, nil // not an object: nothing to leave out
		}
		if _, has := obj["secret"]; !has {
			return item, nil
		}
		delete(obj, "secret")
		return json.Marshal(obj)
	}
	var items []json.RawMessage
	if json.Unmarshal(data, &items) == nil {
		for i, it := range items {
			s, err := strip(it)
			if err != nil {
				return nil, err
			}
			items[i] = s
		}
		b, err := json.Marshal(items)
		if err != nil {
			return nil, err
		}
		env["data"] = b
	} else {
		s, err := strip(data)
		if err != nil {
			return nil, err
		}
		env["data"] = s
	}
	return json.Marshal(env)
}
