package dify

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// JSON allows other spellings of an integer (3.0, 3e0) and the input
// schema's "integer" accepts them: they are read as the integers they are,
// not refused after the host validated them.
func TestIntegerSpellings(t *testing.T) {
	f := newFixture(t, nil)
	var out map[string]any
	f.completed(t, hostsdktest.NewAction(RetrieveCapability(testDataset),
		`{"query":"What is Dify?","retrieval_model":{"search_method":"semantic_search","top_k":3.0}}`), &out)
	r := f.mock.requests(http.MethodPost, "/datasets/"+testDataset+"/retrieve")
	if len(r) != 1 {
		t.Fatalf("retrieve requests %+v", r)
	}
	raw, _ := json.Marshal(r[0].Body["retrieval_model"])
	var rm struct {
		TopK json.Number `json:"top_k"`
	}
	if err := json.Unmarshal(raw, &rm); err != nil || rm.TopK != "3" {
		t.Errorf("retrieve body %s", r[0].Body)
	}
	f.completed(t, hostsdktest.NewAction(AppCapability("support", SuffixConversations), `{"user":"u-1","limit":5e0}`), &out)
	if r := f.mock.requests(http.MethodGet, "/conversations"); len(r) != 1 || r[0].Query.Get("limit") != "5" {
		t.Errorf("conversations requests %+v", r)
	}
}
