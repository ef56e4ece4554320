package dify

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// billingRefusal is what the Service API answers when the workspace's
// plan cannot be read from Dify Cloud's billing service: a ValueError
// (BillingService._send_request), answered 400 invalid_param, also after
// the document was committed.
var billingRefusal = map[string]any{"status": 400, "code": "invalid_param",
	"message": "Unable to retrieve billing information. Please try again later or contact support."}

// listedDocument is one document of a GET .../documents answer.
type listedDocument struct {
	id, name string
	created  time.Time
	status   string
}

// documentsAnswer answers GET .../documents with docs, each made from the
// document's example with its id, name, created_at and indexing_status.
func documentsAnswer(t *testing.T, f *fixture, docs ...listedDocument) http.HandlerFunc {
	t.Helper()
	ex := docExample(t, f.mock.doc, "/datasets/{dataset_id}/documents", "get", "200").(map[string]any)
	proto, _ := json.Marshal(ex["data"].([]any)[0])
	var data []any
	for _, d := range docs {
		var doc map[string]any
		if err := json.Unmarshal(proto, &doc); err != nil {
			t.Fatal(err)
		}
		doc["id"], doc["name"], doc["created_at"], doc["indexing_status"] = d.id, d.name, d.created.Unix(), d.status
		data = append(data, doc)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"data": data, "has_more": len(data) == documentPage,
			"limit": documentPage, "total": len(data), "page": 1})
	}
}

// TestDocumentCreateRefusedAfterCommit: Dify commits a new document before
// it queues its indexing and answers 400 to an error raised then (on Dify
// Cloud, a failed read of the plan from its billing service), so after a
// 400 to a document create the connector lists the documents named like
// it: one created since the create makes the action outcome_unknown
// (never sent again), naming it; before, the 400 was a failed
// provider.invalid_request, inviting a second create.
func TestDocumentCreateRefusedAfterCommit(t *testing.T) {
	f := newFixture(t, nil)
	const doc1, doc2 = "5a0c2b8e-7d3f-4c1a-9e6b-0f1d2c3b4a59", "6b1d3c9f-8e4a-4d2b-8f7c-1a2e3d4c5b6a"
	byText := "/datasets/" + testDataset + "/document/create-by-text"
	byFile := "/datasets/" + testDataset + "/document/create-by-file"
	list := "/datasets/" + testDataset + "/documents"
	enc := base64.StdEncoding.EncodeToString([]byte("%PDF-1.7\nguide"))
	long := strings.Repeat("é", 230)
	now := time.Now()
	cases := []struct {
		name, capID, input, path string
		docs                     []listedDocument
		keyword                  string
		want                     []string
	}{
		{"by text", KnowledgeCapability(testDataset, SuffixDocumentCreate), `{"name":"guide","text":"Dify is a platform.","indexing_technique":"economy"}`, byText,
			[]listedDocument{{doc1, "guide", now, "waiting"}, {doc2, "guide", now.Add(-time.Hour), "completed"}}, "guide",
			[]string{`"` + doc1 + `" ("guide", indexing_status "waiting")`, "document.delete"}},
		{"by file", KnowledgeCapability(testDataset, SuffixDocumentCreateByFile), `{"filename":"guide.pdf","content_base64":"` + enc + `","process_rule":{"mode":"automatic"}}`, byFile,
			[]listedDocument{{doc2, "guide.pdf", now.Add(time.Second), "waiting"}}, "guide.pdf",
			[]string{`"` + doc2 + `" ("guide.pdf", indexing_status "waiting")`}},
		{"name Dify shortens", KnowledgeCapability(testDataset, SuffixDocumentCreate), `{"name":"` + long + `","text":"t"}`, byText,
			[]listedDocument{{doc1, long[:400], now, "waiting"}}, long[:80],
			[]string{doc1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.mock.handle("POST "+tc.path, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusBadRequest, billingRefusal) })
			f.mock.handle("GET "+list, documentsAnswer(t, f, tc.docs...))
			creates, reads := len(f.mock.requests("POST", tc.path)), len(f.mock.requests("GET", list))
			a := hostsdktest.NewAction(tc.capID, tc.input)
			pe := f.Act(t, a).ProtocolError()
			if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
				t.Fatalf("error %+v, want %s", pe, hostsdk.CodeOutcomeUnknown)
			}
			for _, want := range append(tc.want, "the document may have been created", "Dify said: Unable to retrieve billing information") {
				if !strings.Contains(pe.Message, want) {
					t.Errorf("message %q lacks %q", pe.Message, want)
				}
			}
			if st := f.state(t, a); st != aip.StateOutcomeUnknown {
				t.Fatalf("state %s, want outcome_unknown", st)
			}
			got := f.mock.requests("GET", list)[reads:]
			if len(got) != 1 || got[0].Query.Get("keyword") != tc.keyword || got[0].Query.Get("limit") != "100" || got[0].Query.Get("page") != "1" ||
				got[0].Auth != "Bearer "+testDatasetKey {
				t.Fatalf("reads after the refusal: %+v, want one with keyword %q", got, tc.keyword)
			}
			// The same action again: journaled, never sent to Dify.
			f.Act(t, a)
			if n := len(f.mock.requests("POST", tc.path)) - creates; n != 1 {
				t.Fatalf("Dify got %d creates for one action", n)
			}
		})
	}

	// Not settled by the list: outcome_unknown, saying how to look.
	unsettled := []struct {
		name string
		h    http.HandlerFunc
		want string
	}{
		{"list fails", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": 503, "code": "unavailable", "message": "try later"})
		}, "whether it was created could not be read"},
		{"whole page too recent", func(w http.ResponseWriter, r *http.Request) {
			var docs []listedDocument
			for i := range documentPage {
				docs = append(docs, listedDocument{fmt.Sprintf("%08d-0000-4000-8000-000000000000", i), fmt.Sprintf("guide %d", i), now, "completed"})
			}
			documentsAnswer(t, f, docs...)(w, r)
		}, "all too recent to rule it out"},
	}
	for _, tc := range unsettled {
		t.Run(tc.name, func(t *testing.T) {
			f.mock.handle("POST "+byText, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusBadRequest, billingRefusal) })
			f.mock.handle("GET "+list, tc.h)
			pe := f.Act(t, hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentCreate), `{"name":"guide","text":"t"}`)).ProtocolError()
			if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
				t.Fatalf("error %+v, want %s", pe, hostsdk.CodeOutcomeUnknown)
			}
			for _, want := range []string{tc.want, `documents with keyword "guide"`, "before adding it again"} {
				if !strings.Contains(pe.Message, want) {
					t.Errorf("message %q lacks %q", pe.Message, want)
				}
			}
		})
	}
}

// TestDocumentCreateRefused: a 400 stands as a failed result when the
// list shows no document created since the create; an update through
// create-by-text (original_document_id) and a refusal other than 400 are
// not looked up.
func TestDocumentCreateRefused(t *testing.T) {
	f := newFixture(t, nil)
	byText := "/datasets/" + testDataset + "/document/create-by-text"
	list := "/datasets/" + testDataset + "/documents"
	old := time.Now().Add(-time.Hour)
	f.mock.handle("GET "+list, documentsAnswer(t, f, listedDocument{"5a0c2b8e-7d3f-4c1a-9e6b-0f1d2c3b4a59", "guide", old, "completed"}))
	cases := []struct {
		name, input string
		status      int
		body        map[string]any
		code        string
		reads       int
	}{
		{"400 before the commit", `{"name":"guide","text":"t"}`, http.StatusBadRequest,
			map[string]any{"status": 400, "code": "invalid_param", "message": "indexing_technique is required."}, provider.CodeInvalidRequest, 1},
		{"update by original_document_id", `{"name":"guide","text":"t","original_document_id":"` + testDocument + `"}`, http.StatusBadRequest,
			map[string]any{"status": 400, "code": "invalid_param", "message": "Document is not available"}, provider.CodeInvalidRequest, 0},
		{"403", `{"name":"guide","text":"t"}`, http.StatusForbidden,
			map[string]any{"status": 403, "code": "forbidden", "message": "The number of documents has reached the limit of your subscription."}, provider.CodeForbidden, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.mock.handle("POST "+byText, func(w http.ResponseWriter, r *http.Request) { writeJSON(w, tc.status, tc.body) })
			reads := len(f.mock.requests("GET", list))
			pe := f.failed(t, hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentCreate), tc.input))
			if pe.Code != tc.code || strings.Contains(pe.Message, "may have been created") || !strings.Contains(pe.Message, tc.body["message"].(string)) {
				t.Fatalf("error %+v, want %s with Dify's message only", pe, tc.code)
			}
			if n := len(f.mock.requests("GET", list)) - reads; n != tc.reads {
				t.Fatalf("the connector listed the documents %d times, want %d", n, tc.reads)
			}
		})
	}
}
