package chatwoot

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// latestMessages is how many messages GET .../messages answers without
// after or before: the conversation's latest (Chatwoot's MessageFinder).
const latestMessages = 20

// messageClockSkew bounds how far Chatwoot's clock may be behind the
// connector's when a message's created_at is compared with the time the
// connector sent it (messageRefusal).
const messageClockSkew = 5 * time.Minute

// messageRefusal returns err, the error of POST .../messages sending the
// message of call to conversation conversationID from sent on, unchanged
// unless Chatwoot answered 422 and may have stored the message all the
// same; then the error may have been applied (outcome_unknown) and says
// what was found and how to find the rest.
//
// Chatwoot's MessagesController#create answers every StandardError with
// 422 (rescue StandardError => render_could_not_create_error), not only
// the refusals raised before the message is saved (validation, flooding)
// but also those raised after it was committed: the message's
// after_create_commit callbacks (execute_after_create_commit_callbacks:
// reopening the conversation, dispatching its events, queueing its
// delivery with SendReplyJob.perform_later), whose exceptions Rails
// raises out of save!. A 422 alone therefore does not say that nothing
// was stored. The connector reads the conversation's latest messages and
// looks for the one carrying the action's ID in
// content_attributes.aip_action_id: found, the message was stored (and
// may not have been delivered); not found, the refusal stands when the
// list reaches back to before the message was sent (fewer than a full
// page, or a message created more than messageClockSkew before sent);
// anything else (the read failed, or the whole page is newer) may have
// stored it.
func (c *Connector) messageRefusal(ctx context.Context, call *hostsdk.Call, conversationID int64, sent time.Time, err error) error {
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.MayHaveApplied || pe.Status != http.StatusUnprocessableEntity {
		return err
	}
	why := "Chatwoot answers 422 to a message for any error, also one raised after the message was stored " +
		"(while reopening the conversation, dispatching its events or queueing its delivery)"
	look := fmt.Sprintf("list the conversation's messages (message.list) and look for content_attributes.%s %q before sending again",
		ActionIDAttribute, call.Action.ID)
	var out struct {
		Payload []struct {
			ID                any            `json:"id"`
			CreatedAt         *int64         `json:"created_at"`
			ContentAttributes map[string]any `json:"content_attributes"`
		} `json:"payload"`
	}
	rerr := c.client.JSON(ctx, provider.Request{Method: http.MethodGet, Path: c.conversationPath(conversationID) + "/messages"}, &out)
	var found string
	switch {
	case rerr != nil:
		found = fmt.Sprintf("whether it was stored could not be read (%v): %s", rerr, look)
	default:
		before := sent.Add(-messageClockSkew).Unix()
		older := len(out.Payload) < latestMessages
		for _, m := range out.Payload {
			if id, _ := m.ContentAttributes[ActionIDAttribute].(string); id == call.Action.ID {
				found = fmt.Sprintf("it stored the message all the same (message %v of conversation %d): it may not have been delivered; "+
					"look at that message before sending again", m.ID, conversationID)
				break
			}
			// created_at is whole seconds: a message stamped before the
			// second in which sent-skew falls was created before sent.
			if m.CreatedAt != nil && *m.CreatedAt < before {
				older = true
			}
		}
		if found == "" && older {
			return err // not stored: the refusal stands
		}
		if found == "" {
			found = fmt.Sprintf("it is not among the conversation's %d latest messages, but they are all too recent to rule it out: %s",
				latestMessages, look)
		}
	}
	pe.MayHaveApplied = true
	pe.Message = fmt.Sprintf("refused, but the message may have been stored: %s; %s. Chatwoot said: %s", why, found, pe.Message)
	return err
}
