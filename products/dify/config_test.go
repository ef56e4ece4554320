package dify

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
)

func TestNewRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	key := writeFile(t, dir, "ok.key", "app-key", 0o600)
	openKey := writeFile(t, dir, "open.key", "app-key", 0o644)
	spaced := writeFile(t, dir, "spaced.key", "app key", 0o600)
	apps := func(name, body string) string { return writeFile(t, dir, name, body, 0o644) }
	entry := func(id, mode, keyFile string) string {
		return fmt.Sprintf(`{"id":%q,"name":"App","mode":%q,"api_key_file":%q}`, id, mode, keyFile)
	}
	good := apps("good.json", "["+entry("a", "chat", key)+"]")
	var many []string
	for i := range 200 {
		many = append(many, entry(fmt.Sprintf("app%d", i), "chat", key))
	}
	cases := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"no base URL", Config{AppsFile: good}, []string{"--dify-base-url", "no URL"}},
		{"insecure base URL", Config{BaseURL: "http://dify.example.com/v1", AppsFile: good}, []string{"--dify-base-url", "use https"}},
		{"base URL with query", Config{BaseURL: "https://dify.example.com/v1?x=1", AppsFile: good}, []string{"--dify-base-url", "query"}},
		{"nothing configured", Config{BaseURL: "https://api.dify.ai/v1"}, []string{"--dify-apps-file", "--dify-knowledge-file", "at least one"}},
		{"missing apps file", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: dir + "/nope.json"}, []string{"--dify-apps-file"}},
		{"writable apps file", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: writeFile(t, dir, "w.json", "["+entry("a", "chat", key)+"]", 0o666)},
			[]string{"--dify-apps-file"}},
		{"not JSON", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("bad.json", "{")}, []string{"--dify-apps-file", "not a JSON array"}},
		{"unknown field", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("unknown.json", `[{"id":"a","name":"A","mode":"chat","api_key_file":"`+key+`","token":"x"}]`)},
			[]string{"--dify-apps-file", "unknown field"}},
		{"trailing data", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("trail.json", "["+entry("a", "chat", key)+"] []")}, []string{"--dify-apps-file", "has data after the JSON value"}},
		{"empty array", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("empty.json", "[]")}, []string{"--dify-apps-file", "lists 0 entries"}},
		{"bad mode", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("mode.json", "["+entry("a", "chatbot", key)+"]")}, []string{"--dify-apps-file", `mode "chatbot"`}},
		{"bad id", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("id.json", "["+entry("a:b", "chat", key)+"]")}, []string{"--dify-apps-file", `id "a:b"`}},
		{"duplicate id", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("dup.json", "["+entry("a", "chat", key)+","+entry("a", "workflow", key)+"]")},
			[]string{"--dify-apps-file", "listed twice"}},
		{"no key file", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("nokey.json", `[{"id":"a","name":"A","mode":"chat"}]`)},
			[]string{"--dify-apps-file", "api_key_file", "no file given"}},
		{"key file too open", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("open.json", "["+entry("a", "chat", openKey)+"]")},
			[]string{"--dify-apps-file", "api_key_file", "chmod"}},
		{"key with a space", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("spaced.json", "["+entry("a", "chat", spaced)+"]")},
			[]string{"--dify-apps-file", "whitespace"}},
		{"unreadable key file", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("missingkey.json", "["+entry("a", "chat", dir+"/missing.key")+"]")},
			[]string{"--dify-apps-file", "api_key_file"}},
		{"bad knowledge entry", Config{BaseURL: "https://api.dify.ai/v1", KnowledgeFile: apps("k.json", `[{"id":"d","name":"D","mode":"chat","api_key_file":"`+key+`"}]`)},
			[]string{"--dify-knowledge-file", "unknown field"}},
		{"too many capabilities", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: apps("many.json", "["+strings.Join(many, ",")+"]")},
			[]string{"3000 capabilities", "at most 512"}},
		{"response bound", Config{BaseURL: "https://api.dify.ai/v1", AppsFile: good, MaxResponseBytes: MaxResponseBytesLimit + 1}, []string{"--dify-max-response-bytes"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			if err == nil {
				t.Fatal("New accepted the config")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "app-key") {
				t.Errorf("error %q carries the key", err)
			}
		})
	}

	// The accepted forms: a loopback http URL with a path, knowledge only.
	k := apps("knowledge.json", `[{"id":"ds-1","name":"Docs","api_key_file":"`+key+`"}]`)
	for _, cfg := range []Config{
		{BaseURL: "http://127.0.0.1:5001/v1/", AppsFile: good},
		{BaseURL: "https://api.dify.ai/v1", KnowledgeFile: k},
		{BaseURL: "https://api.dify.ai/v1", AppsFile: good, KnowledgeFile: k},
	} {
		if _, err := New(cfg); err != nil {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
}

// TestProductSettings: the flags and variables reach New.
func TestProductSettings(t *testing.T) {
	dir := t.TempDir()
	key := writeFile(t, dir, "ok.key", "app-key", 0o600)
	b, _ := json.Marshal([]map[string]string{{"id": "a", "name": "A", "mode": "workflow", "api_key_file": key}})
	appsFile := writeFile(t, dir, "apps.json", string(b), 0o644)
	fs := flag.NewFlagSet("dify", flag.ContinueOnError)
	load := hostsdk.BindSettings(fs, Product.Settings)
	if err := fs.Parse([]string{"--dify-apps-file", appsFile}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"AIP_DIFY_BASE_URL": "https://api.dify.ai/v1", "AIP_DIFY_MAX_RESPONSE_BYTES": "4096"}
	values, err := load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	c, err := Product.New(values, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	conn := c.(*Connector)
	if conn.cfg.MaxResponseBytes != 4096 || conn.base.String() != "https://api.dify.ai/v1" || len(conn.apps) != 1 {
		t.Errorf("config %+v base %s", conn.cfg, conn.base)
	}
	// Without a base URL the product says which setting to give, and
	// the error matches hostsdk.ErrSetting (aip-host exits 2 for it), as
	// does every refusal of Product.New.
	values[FlagBaseURL] = ""
	if _, err := Product.New(values, nil); err == nil || !strings.Contains(err.Error(), "--dify-base-url") || !errors.Is(err, hostsdk.ErrSetting) {
		t.Errorf("no base URL: %v; want an error naming --dify-base-url that matches hostsdk.ErrSetting", err)
	}
	values[FlagBaseURL] = "https://api.dify.ai/v1"
	values[FlagAppsFile] = filepath.Join(dir, "missing.json")
	if _, err := Product.New(values, nil); err == nil || !strings.Contains(err.Error(), "--dify-apps-file") || !errors.Is(err, hostsdk.ErrSetting) {
		t.Errorf("missing apps file: %v; want an error naming --dify-apps-file that matches hostsdk.ErrSetting", err)
	}
}
