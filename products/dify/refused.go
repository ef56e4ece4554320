package dify

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// documentPage is how many documents the connector reads after a refused
// document create: the Service API's largest page (the document: "Server
// caps at 100").
const documentPage = 100

// documentClockSkew bounds how far Dify's clock may be behind the
// connector's when a document's created_at is compared with the time the
// connector sent the create (documentRefusal).
const documentClockSkew = 5 * time.Minute

// Dify keeps at most storedNameLen characters of a document's name
// (FileService.upload_text and upload_file in api/services/
// file_service.py shorten a longer one), and the connector searches by the
// first keywordLen characters.
const (
	storedNameLen = 200
	keywordLen    = 40
)

// documentRefusal returns err, the error of a document create
// (create-by-text without original_document_id, create-by-file) of the
// document named name (the text's name, or the file's name when file)
// in knowledge base datasetID, sent at sent, unchanged unless Dify
// answered 400 and may have created the document all the same; then the
// error may have been applied (outcome_unknown) and says what was found
// and how to find the rest.
//
// DocumentService.save_document_with_dataset_id (api/services/
// dataset_service.py) commits the new document (db.session.commit) and
// only then queues its indexing: DocumentIndexingTaskProxy(...).delay()
// (api/services/document_indexing_proxy/), which first reads the
// workspace's plan with FeatureService.get_features. On Dify Cloud that
// is a request to the billing service (BillingService.get_info, GET
// /subscription/info, and get_quota_info), whose non-200 answer raises a
// ValueError ("Unable to retrieve billing information. Please try again
// later or contact support.", _BillingHTTPStatusError), and so would a
// billing answer that does not validate (pydantic's ValidationError is a
// ValueError); the Service API answers any ValueError 400 invalid_param
// (api/libs/external_api.py, handle_value_error). A 400 therefore does
// not say that no document was created: such a document exists, never
// queued for indexing (indexing_status waiting). The other refusals the
// document lists (provider_not_initialize, no_file_uploaded, ...) and
// every other 400 of the path are raised before the commit.
//
// The connector lists the knowledge base's documents whose name holds the
// name's first keywordLen characters (GET .../documents?keyword=, one
// page of documentPage, newest first: DocumentListApi orders by
// created_at descending) and looks for one named as the document would
// be, created since sent less documentClockSkew. Found: the error may
// have been applied, naming the documents. Not found: the refusal stands
// when the page reaches back to before the create (fewer than a full
// page, or a document created before then); anything else (the read
// failed, or the whole page is newer) may have created it.
func (c *Connector) documentRefusal(ctx context.Context, cl *provider.Client, datasetID, name string, file bool, sent time.Time, err error) error {
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.MayHaveApplied || pe.Status != http.StatusBadRequest {
		return err
	}
	long := utf8.RuneCountInString(name) > storedNameLen
	keyword := name
	if long && file {
		// upload_file keeps filename.split(".")[0][:200] + "." + its
		// extension: the name's start up to its first dot.
		keyword, _, _ = strings.Cut(name, ".")
	}
	keyword = prefix(keyword, keywordLen)
	since := sent.Add(-documentClockSkew)
	why := "Dify commits a new document before queueing its indexing and answers 400 to an error raised then " +
		"(on Dify Cloud, a failed read of the plan from its billing service)"
	list := "documents"
	if keyword != "" {
		list = fmt.Sprintf("documents with keyword %q", provider.Excerpt(keyword))
	}
	look := fmt.Sprintf("list the knowledge base's documents (%s) and look for %q created since %s before adding it again",
		list, provider.Excerpt(name), since.UTC().Format(time.RFC3339))
	q := url.Values{"page": {"1"}, "limit": {strconv.Itoa(documentPage)}}
	if keyword != "" {
		q.Set("keyword", keyword)
	}
	var out struct {
		Data []struct {
			ID             string `json:"id"`
			Name           string `json:"name"`
			CreatedAt      *int64 `json:"created_at"`
			IndexingStatus string `json:"indexing_status"`
		} `json:"data"`
	}
	rerr := cl.JSON(ctx, provider.Request{Method: http.MethodGet, Path: "/datasets/" + escape(datasetID) + "/documents", Query: q}, &out)
	var found string
	switch {
	case rerr != nil:
		found = fmt.Sprintf("whether it was created could not be read (%v): %s", rerr, look)
	default:
		older := len(out.Data) < documentPage
		var docs []string
		for _, d := range out.Data {
			// created_at is whole seconds: a document stamped before the
			// second in which since falls was created before since.
			if d.CreatedAt != nil && *d.CreatedAt < since.Unix() {
				older = true
				continue
			}
			if d.Name == name || (long && strings.HasPrefix(d.Name, keyword)) {
				docs = append(docs, fmt.Sprintf("%q (%q, indexing_status %q)",
					provider.Excerpt(d.ID), provider.Excerpt(d.Name), provider.Excerpt(d.IndexingStatus)))
			}
		}
		if len(docs) == 0 && older {
			return err // not created: the refusal stands
		}
		if len(docs) > maxNamedDocuments {
			docs = append(docs[:maxNamedDocuments], fmt.Sprintf("and %d more", len(docs)-maxNamedDocuments))
		}
		if len(docs) > 0 {
			found = fmt.Sprintf("it created the document all the same, its indexing maybe never queued: %s; "+
				"read it (document.get), and delete it (document.delete) or keep it before adding it again",
				strings.Join(docs, ", "))
		} else {
			found = fmt.Sprintf("it is not among the %d latest documents named like it, but they are all too recent to rule it out: %s",
				documentPage, look)
		}
	}
	pe.MayHaveApplied = true
	pe.Message = fmt.Sprintf("refused, but the document may have been created: %s; %s. Dify said: %s", why, found, pe.Message)
	return err
}

// maxNamedDocuments bounds the documents a refusal's message names.
const maxNamedDocuments = 3

// prefix returns the first n characters of s.
func prefix(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}
