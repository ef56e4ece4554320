package hostsdk

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/aipfleet/aipfleet/aip"
)

// capability is a manifest capability with its compiled schemas.
type capability struct {
	cap    *aip.Capability
	input  *jsonschema.Schema
	output *jsonschema.Schema // nil when the capability has no output_schema
}

// CheckCapability compiles a capability's input and output schemas the way
// a host does when it binds a manifest (draft 2020-12 unless the schema
// says otherwise; no $ref is fetched from files or the network), so that a
// capability the host would refuse can be found before it is offered.
func CheckCapability(c *aip.Capability) error {
	if _, err := compileCapability(c); err != nil {
		return fmt.Errorf("hostsdk: %w", err)
	}
	return nil
}

func compileCapability(c *aip.Capability) (*capability, error) {
	in, err := compileSchema(c.ID, "input_schema", c.InputSchema)
	if err != nil {
		return nil, err
	}
	out := &capability{cap: c, input: in}
	if len(c.OutputSchema) > 0 && !bytes.Equal(bytes.TrimSpace(c.OutputSchema), []byte("null")) {
		if out.output, err = compileSchema(c.ID, "output_schema", c.OutputSchema); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func compileSchema(capID, member string, raw json.RawMessage) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("capability %s %s is not JSON: %w", capID, member, err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	// Schemas are self-contained: no $ref is fetched from files or the network.
	c.UseLoader(refusingLoader{})
	url := "urn:aipfleet:capability:" + capID + ":" + member
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("capability %s %s: %w", capID, member, err)
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("capability %s %s does not compile: %w", capID, member, err)
	}
	return s, nil
}

type refusingLoader struct{}

func (refusingLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema reference %s is not loaded: capability schemas must be self-contained", url)
}

// validate checks a JSON document against s and returns a short message.
func validateJSON(s *jsonschema.Schema, raw json.RawMessage) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("not JSON: %v", err)
	}
	if err := s.Validate(doc); err != nil {
		msg := err.Error()
		if ve, ok := err.(*jsonschema.ValidationError); ok {
			msg = strings.TrimSpace(fmt.Sprintf("%v", ve))
		}
		return fmt.Errorf("%s", aip.TruncateUTF8(msg, aip.MaxErrorMessageBytes))
	}
	return nil
}
