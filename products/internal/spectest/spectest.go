// Package spectest holds the products' published API documents and checks
// that the requests a product adapter sends are ones those documents
// describe. The adapters' tests run their mock providers behind
// Spec.Handler: a request whose method and path the document does not
// have, that lacks a required parameter or credential header, carries a
// query parameter the operation does not declare, a parameter value its
// schema's type or enum refuses (path segments included) or a parameter
// that is not an array more than once, or whose JSON body does not
// validate against the operation's request schema or has a member the
// schema does not list (see undocumentedMember), fails the test and gets
// a 400 naming what is wrong.
//
// The documents in specs/ are whole and unmodified, each with the
// SOURCE.md that says where it comes from (repository, commit, licence).
// Twenty and Hermes Agent publish no static OpenAPI document; their mocks
// follow their reference pages instead.
package spectest

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"
)

//go:embed specs
var specs embed.FS

// Spec is one loaded OpenAPI document.
type Spec struct {
	name string
	// Prefix is the path of the document's first server URL ("/v1" for
	// Dify's Service API, "" when it has none): operations' paths follow
	// it. Point an adapter's base URL at mock.URL + Prefix.
	Prefix   string
	doc      map[string]any
	ops      []operation
	compiler *jsonschema.Compiler
	mu       sync.Mutex
	schemas  map[string]*jsonschema.Schema
}

type operation struct {
	method, template string
	pattern          *regexp.Regexp
	pointer          string // JSON pointer of the operation object
	op               map[string]any
	pathItem         map[string]any
}

// Load reads an embedded document by its path under specs/, for example
// "chatwoot/swagger.json" or "crewai/enterprise-api.en.yaml".
func Load(t testing.TB, file string) *Spec {
	t.Helper()
	s, err := load(file)
	if err != nil {
		t.Fatalf("spectest: %v", err)
	}
	return s
}

var cache sync.Map // file → *Spec

func load(file string) (*Spec, error) {
	if s, ok := cache.Load(file); ok {
		return s.(*Spec), nil
	}
	raw, err := specs.ReadFile("specs/" + file)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if strings.HasSuffix(file, ".yaml") || strings.HasSuffix(file, ".yml") {
		var y any
		if err := yaml.Unmarshal(raw, &y); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		// Round trip through JSON so that every map is map[string]any.
		b, err := json.Marshal(y)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		raw = b
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	version, _ := doc["openapi"].(string)
	if !strings.HasPrefix(version, "3.") {
		return nil, fmt.Errorf("%s: openapi %q, want 3.x", file, version)
	}
	draft := jsonschema.Draft2020
	if strings.HasPrefix(version, "3.0") {
		// OpenAPI 3.0 schemas are draft-4-like: boolean exclusive bounds,
		// and "nullable" instead of a null type.
		draft = jsonschema.Draft4
		nullable(doc)
	}
	anyOf(doc)
	s := &Spec{name: file, doc: doc, schemas: map[string]*jsonschema.Schema{}}
	if servers, ok := doc["servers"].([]any); ok && len(servers) > 0 {
		if m, ok := servers[0].(map[string]any); ok {
			if u, ok := m["url"].(string); ok {
				vars, _ := m["variables"].(map[string]any)
				for name, v := range vars {
					def, _ := v.(map[string]any)["default"].(string)
					u = strings.ReplaceAll(u, "{"+name+"}", def)
				}
				s.Prefix = serverPath(u)
			}
		}
	}
	paths, _ := doc["paths"].(map[string]any)
	for tmpl, item := range paths {
		pi, _ := item.(map[string]any)
		for method, op := range pi {
			m := strings.ToUpper(method)
			if !slices.Contains([]string{"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"}, m) {
				continue
			}
			o, _ := op.(map[string]any)
			s.ops = append(s.ops, operation{method: m, template: tmpl, pattern: templatePattern(tmpl),
				pointer: "/paths/" + escape(tmpl) + "/" + method, op: o, pathItem: pi})
		}
	}
	// Literal paths before templated ones, so /bookings/upcoming wins over
	// /bookings/{uid}.
	slices.SortFunc(s.ops, func(a, b operation) int {
		return strings.Count(a.template, "{") - strings.Count(b.template, "{")
	})
	s.compiler = jsonschema.NewCompiler()
	s.compiler.DefaultDraft(draft)
	if err := s.compiler.AddResource("mem:///"+file, doc); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	cache.Store(file, s)
	return s, nil
}

// serverPath returns the path of a server URL ("https://api.dify.ai/v1" →
// "/v1"), ignoring variables in the host.
func serverPath(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		u = u[i+3:]
		if j := strings.Index(u, "/"); j >= 0 {
			return strings.TrimSuffix(u[j:], "/")
		}
		return ""
	}
	return strings.TrimSuffix(u, "/")
}

// nullable rewrites OpenAPI 3.0's {"type": T, "nullable": true} as
// {"type": [T, "null"]}, everywhere in v.
func nullable(v any) {
	switch x := v.(type) {
	case map[string]any:
		if n, _ := x["nullable"].(bool); n {
			if t, ok := x["type"].(string); ok {
				x["type"] = []any{t, "null"}
			}
		}
		for _, c := range x {
			nullable(c)
		}
	case []any:
		for _, c := range x {
			nullable(c)
		}
	}
}

// anyOf rewrites every oneOf without a discriminator as anyOf, everywhere
// in v. Published documents use oneOf for alternatives that overlap (Cal.com's
// three booking inputs share their required members and allow others), so
// under oneOf's exactly-one rule every valid body would be refused; a body
// that matches one alternative is what the provider accepts. Tests that
// need one alternative in particular check it with ValidateSchema.
func anyOf(v any) {
	switch x := v.(type) {
	case map[string]any:
		if alts, ok := x["oneOf"]; ok && x["discriminator"] == nil {
			if _, taken := x["anyOf"]; !taken {
				x["anyOf"] = alts
				delete(x, "oneOf")
			}
		}
		for _, c := range x {
			anyOf(c)
		}
	case []any:
		for _, c := range x {
			anyOf(c)
		}
	}
}

func escape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

var paramRE = regexp.MustCompile(`\{[^}]+\}`)

func templatePattern(tmpl string) *regexp.Regexp {
	parts := paramRE.Split(tmpl, -1)
	var b strings.Builder
	b.WriteString("^")
	for i, p := range parts {
		if i > 0 {
			b.WriteString("([^/]+)")
		}
		b.WriteString(regexp.QuoteMeta(p))
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// Operations lists the document's operations as "METHOD /template".
func (s *Spec) Operations() []string {
	var out []string
	for _, o := range s.ops {
		out = append(out, o.method+" "+o.template)
	}
	slices.Sort(out)
	return out
}

// Has reports whether the document has the operation "METHOD /template"
// (the template exactly as the document writes it).
func (s *Spec) Has(op string) bool { return slices.Contains(s.Operations(), op) }

// Check checks one request against the document: r's method and path
// (after Prefix), its required query and header parameters, its query
// parameters' names and its path and query values, its credentials, and
// its JSON body. It returns the operation's template on
// success.
func (s *Spec) Check(r *http.Request, body []byte) (string, error) {
	p := r.URL.Path
	if s.Prefix != "" {
		rest, ok := strings.CutPrefix(p, s.Prefix)
		if !ok {
			return "", fmt.Errorf("%s: %s %s is not under the server path %s", s.name, r.Method, p, s.Prefix)
		}
		p = rest
	}
	var op *operation
	pathKnown := false
	for i := range s.ops {
		o := &s.ops[i]
		if !o.pattern.MatchString(p) {
			continue
		}
		pathKnown = true
		if o.method == r.Method {
			op = o
			break
		}
	}
	if op == nil {
		if pathKnown {
			return "", fmt.Errorf("%s: %s has no %s operation", s.name, p, r.Method)
		}
		return "", fmt.Errorf("%s: no path matches %s %s", s.name, r.Method, p)
	}
	for _, prm := range s.parameters(op) {
		name, _ := prm["name"].(string)
		in, _ := prm["in"].(string)
		required, _ := prm["required"].(bool)
		if !required {
			continue
		}
		switch in {
		case "query":
			if !r.URL.Query().Has(name) {
				return "", fmt.Errorf("%s: %s %s: required query parameter %q is missing", s.name, op.method, op.template, name)
			}
		case "header":
			if r.Header.Get(name) == "" {
				return "", fmt.Errorf("%s: %s %s: required header %q is missing", s.name, op.method, op.template, name)
			}
		}
	}
	if err := s.checkParameters(op, r, p); err != nil {
		return "", err
	}
	if err := s.checkSecurity(op, r); err != nil {
		return "", err
	}
	if err := s.checkBody(op, r, body); err != nil {
		return "", err
	}
	return op.template, nil
}

// checkParameters refuses a query parameter the operation does not
// declare, a parameter that is not an array given more than once, and a
// path or query value its schema's type or enum refuses (an integer ID
// sent as "42.0", a status outside the enum): the document describes
// those, and a provider reads others differently or not at all.
func (s *Spec) checkParameters(op *operation, r *http.Request, path string) error {
	schemas := map[string]map[string]any{} // "in name" → schema
	for _, prm := range s.parameters(op) {
		name, _ := prm["name"].(string)
		in, _ := prm["in"].(string)
		schemas[in+" "+name] = s.deref(prm["schema"])
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s: %s %s: "+format, append([]any{s.name, op.method, op.template}, args...)...)
	}
	for name, values := range r.URL.Query() {
		sch, ok := schemas["query "+name]
		if !ok {
			return fail("query parameter %q is not in the document", name)
		}
		if len(values) > 1 && !hasType(sch, "array") {
			return fail("query parameter %q is given %d times; the document has one value", name, len(values))
		}
		for _, v := range values {
			if err := checkValue(s, sch, v); err != nil {
				return fail("query parameter %q: %v", name, err)
			}
		}
	}
	names := paramRE.FindAllString(op.template, -1)
	values := op.pattern.FindStringSubmatch(path)
	for i, n := range names {
		if sch, ok := schemas["path "+strings.Trim(n, "{}")]; ok && i+1 < len(values) {
			if err := checkValue(s, sch, values[i+1]); err != nil {
				return fail("path parameter %s: %v", n, err)
			}
		}
	}
	return nil
}

// checkValue checks one parameter value (a query value or a path
// segment) against its schema's type and enum. An array's value is one
// item (the parameter repeated: form style, explode) or items joined by
// commas (form style without explode, which Cal.com's documentation asks
// for and Chatwoot's label filter reads).
func checkValue(s *Spec, sch map[string]any, v string) error {
	if hasType(sch, "array") {
		items := s.deref(sch["items"])
		if items == nil {
			return nil
		}
		for _, item := range strings.Split(v, ",") {
			if err := checkValue(s, items, item); err != nil {
				return err
			}
		}
		return nil
	}
	if enum, ok := sch["enum"].([]any); ok {
		found := false
		for _, e := range enum {
			found = found || fmt.Sprint(e) == v
		}
		if !found {
			return fmt.Errorf("%q is not one of %v", v, enum)
		}
	}
	switch {
	case hasType(sch, "string") || sch["type"] == nil:
		return nil
	case hasType(sch, "integer") && integerRE.MatchString(v):
		return nil
	case hasType(sch, "number") && numberRE.MatchString(v):
		return nil
	case hasType(sch, "boolean") && (v == "true" || v == "false"):
		return nil
	}
	return fmt.Errorf("%q is not of type %v", v, sch["type"])
}

var (
	integerRE = regexp.MustCompile(`^-?(0|[1-9][0-9]*)$`)
	numberRE  = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$`)
)

// hasType reports whether a schema's type (a name, or a list of names in
// OpenAPI 3.1) includes t.
func hasType(sch map[string]any, t string) bool {
	switch v := sch["type"].(type) {
	case string:
		return v == t
	case []any:
		for _, x := range v {
			if x == t {
				return true
			}
		}
	}
	return false
}

// parameters returns the operation's and its path item's parameters,
// with references resolved.
func (s *Spec) parameters(op *operation) []map[string]any {
	var out []map[string]any
	for _, list := range []any{op.pathItem["parameters"], op.op["parameters"]} {
		items, _ := list.([]any)
		for _, it := range items {
			if m := s.deref(it); m != nil {
				out = append(out, m)
			}
		}
	}
	return out
}

func (s *Spec) deref(v any) map[string]any {
	m, _ := v.(map[string]any)
	for range 8 {
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		m = s.pointer(strings.TrimPrefix(ref, "#"))
	}
	return m
}

func (s *Spec) pointer(ptr string) map[string]any {
	var cur any = s.doc
	for _, tok := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[tok]
	}
	m, _ := cur.(map[string]any)
	return m
}

// checkSecurity requires the credential of at least one of the
// operation's security requirements (the document's when it has none of
// its own): an apiKey header, or an Authorization header of the http
// scheme.
func (s *Spec) checkSecurity(op *operation, r *http.Request) error {
	reqs, ok := op.op["security"].([]any)
	if !ok {
		reqs, _ = s.doc["security"].([]any)
	}
	if len(reqs) == 0 {
		return nil
	}
	schemes := s.pointer("/components/securitySchemes")
	var missing []string
	for _, req := range reqs {
		m, _ := req.(map[string]any)
		if len(m) == 0 {
			return nil // an empty requirement: anonymous access allowed
		}
		all := true
		for name := range m {
			sc, _ := schemes[name].(map[string]any)
			switch sc["type"] {
			case "apiKey":
				hname, _ := sc["name"].(string)
				if sc["in"] == "header" && r.Header.Get(hname) == "" {
					all = false
					missing = append(missing, "header "+hname)
				}
			case "http":
				scheme, _ := sc["scheme"].(string)
				auth := r.Header.Get("Authorization")
				if !strings.HasPrefix(strings.ToLower(auth), strings.ToLower(scheme)+" ") || len(auth) <= len(scheme)+1 {
					all = false
					missing = append(missing, "Authorization: "+scheme)
				}
			}
		}
		if all {
			return nil
		}
	}
	return fmt.Errorf("%s: %s %s: no credentials (want one of %s)", s.name, op.method, op.template, strings.Join(missing, ", "))
}

// checkBody validates a JSON body against the operation's request schema,
// and requires a body when the document says it is required.
func (s *Spec) checkBody(op *operation, r *http.Request, body []byte) error {
	rb := s.deref(op.op["requestBody"])
	if rb == nil {
		return nil
	}
	required, _ := rb["required"].(bool)
	if len(bytes.TrimSpace(body)) == 0 {
		if required {
			return fmt.Errorf("%s: %s %s: the request body is required", s.name, op.method, op.template)
		}
		return nil
	}
	content, _ := rb["content"].(map[string]any)
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if _, ok := content[mt]; !ok {
		var have []string
		for k := range content {
			have = append(have, k)
		}
		slices.Sort(have)
		return fmt.Errorf("%s: %s %s: content type %q, the document accepts %s", s.name, op.method, op.template, mt, strings.Join(have, ", "))
	}
	if mt == "multipart/form-data" {
		return s.checkMultipart(op, content[mt], r, body)
	}
	if mt != "application/json" {
		return nil
	}
	media, _ := content[mt].(map[string]any)
	if media["schema"] == nil {
		return nil
	}
	var ptr string
	if ref, ok := media["schema"].(map[string]any)["$ref"].(string); ok {
		ptr = strings.TrimPrefix(ref, "#")
	} else {
		ptr = op.pointer + "/requestBody/content/" + escape(mt) + "/schema"
		if _, isRef := op.op["requestBody"].(map[string]any)["$ref"]; isRef {
			ref := op.op["requestBody"].(map[string]any)["$ref"].(string)
			ptr = strings.TrimPrefix(ref, "#") + "/content/" + escape(mt) + "/schema"
		}
	}
	sch, err := s.schema(ptr)
	if err != nil {
		return fmt.Errorf("%s: compile the request schema of %s %s: %w", s.name, op.method, op.template, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s: %s %s: the body is not JSON: %w", s.name, op.method, op.template, err)
	}
	if err := sch.Validate(v); err != nil {
		return fmt.Errorf("%s: %s %s: the body does not match the document's schema: %v", s.name, op.method, op.template, err)
	}
	if at := s.undocumentedMember(s.deref(media["schema"]), v, ""); at != "" {
		return fmt.Errorf("%s: %s %s: the body member %s is not in the document's schema", s.name, op.method, op.template, at)
	}
	return nil
}

// undocumentedMember returns the path (e.g. "message.content_attributes")
// of the first member of v that sch does not describe, or "". Published
// schemas seldom say additionalProperties false, so a misspelled member,
// which the provider ignores, would otherwise validate: a member is
// undocumented when its object's schema lists properties and neither
// allows others (additionalProperties, patternProperties) nor composes
// alternatives (allOf, anyOf, oneOf), whose members this check does not
// follow.
func (s *Spec) undocumentedMember(sch map[string]any, v any, at string) string {
	if sch == nil {
		return ""
	}
	for _, k := range []string{"allOf", "anyOf", "oneOf"} {
		if _, ok := sch[k]; ok {
			return ""
		}
	}
	switch v := v.(type) {
	case map[string]any:
		props, ok := sch["properties"].(map[string]any)
		if !ok {
			return ""
		}
		_, more := sch["additionalProperties"]
		_, pattern := sch["patternProperties"]
		names := make([]string, 0, len(v))
		for name := range v {
			names = append(names, name)
		}
		slices.Sort(names)
		for _, name := range names {
			path := strings.TrimPrefix(at+"."+name, ".")
			prop, known := props[name]
			if !known {
				if more || pattern {
					continue
				}
				return path
			}
			if p := s.undocumentedMember(s.deref(prop), v[name], path); p != "" {
				return p
			}
		}
	case []any:
		items := s.deref(sch["items"])
		for i, item := range v {
			if p := s.undocumentedMember(items, item, fmt.Sprintf("%s[%d]", at, i)); p != "" {
				return p
			}
		}
	}
	return ""
}

// checkMultipart checks a multipart/form-data body against the media
// type's object schema: every required property is a part, every part is
// a property, a property of format binary is a file part (with a
// filename) and any other a plain field; a part given twice is refused.
func (s *Spec) checkMultipart(op *operation, media any, r *http.Request, body []byte) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s: %s %s: multipart body: "+format, append([]any{s.name, op.method, op.template}, args...)...)
	}
	_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || params["boundary"] == "" {
		return fail("the Content-Type has no boundary")
	}
	m, _ := media.(map[string]any)
	schema := s.deref(m["schema"])
	props, _ := schema["properties"].(map[string]any)
	seen := map[string]bool{}
	mr := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fail("%v", err)
		}
		name := p.FormName()
		prop := s.deref(props[name])
		if prop == nil {
			return fail("part %q is not a property of the document's schema", name)
		}
		if seen[name] {
			return fail("part %q is given twice", name)
		}
		seen[name] = true
		_, disp, _ := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
		_, isFile := disp["filename"]
		if binary := prop["format"] == "binary"; binary != isFile {
			if binary {
				return fail("part %q must be a file (with a filename)", name)
			}
			return fail("part %q must be a plain field, not a file", name)
		}
	}
	required, _ := schema["required"].([]any)
	for _, req := range required {
		if name, _ := req.(string); !seen[name] {
			return fail("the required part %q is missing", name)
		}
	}
	return nil
}

// ValidateSchema validates a JSON body against the document's schema at
// ptr, a JSON pointer such as "/components/schemas/CreateBookingInput".
func (s *Spec) ValidateSchema(ptr string, body []byte) error {
	sch, err := s.schema(ptr)
	if err != nil {
		return fmt.Errorf("%s: compile %s: %w", s.name, ptr, err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("%s: the body is not JSON: %w", s.name, err)
	}
	if err := sch.Validate(v); err != nil {
		return fmt.Errorf("%s: the body does not match %s: %v", s.name, ptr, err)
	}
	return nil
}

func (s *Spec) schema(ptr string) (*jsonschema.Schema, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sch, ok := s.schemas[ptr]; ok {
		return sch, nil
	}
	sch, err := s.compiler.Compile("mem:///" + s.name + "#" + ptr)
	if err != nil {
		return nil, err
	}
	s.schemas[ptr] = sch
	return sch, nil
}

// Handler returns a handler that checks every request against the
// document before passing it to mock: a request the document does not
// describe fails t and is answered 400 with the reason. Operations
// returns what was served.
func (s *Spec) Handler(t testing.TB, mock http.Handler) *Checked {
	return &Checked{spec: s, t: t, mock: mock}
}

// Checked is a mock provider behind a Spec check.
type Checked struct {
	spec *Spec
	t    testing.TB
	mock http.Handler
	mu   sync.Mutex
	seen []string
}

// ServeHTTP checks the request, then serves it with the mock.
func (c *Checked) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	tmpl, err := c.spec.Check(r, body)
	if err != nil {
		c.t.Errorf("mock provider: %v", err)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(map[string]string{"message": err.Error()})
		return
	}
	c.mu.Lock()
	c.seen = append(c.seen, r.Method+" "+tmpl)
	c.mu.Unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	c.mock.ServeHTTP(w, r)
}

// Served returns the operations served so far, as "METHOD /template".
func (c *Checked) Served() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.seen)
}
