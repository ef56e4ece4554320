package registry

import (
	"fmt"
	"iter"
	"strconv"
	"strings"
)

// ReadContext says on whose behalf a catalog read runs. A tenant read sees
// the capabilities the tenant can use (see Catalog). An internal read,
// requested explicitly, sees every active definition, bound or not, and
// ignores TenantID. A read with neither sees nothing.
type ReadContext struct {
	TenantID string
	Internal bool
}

// ForTenant returns the read context of a verified tenant.
func ForTenant(tenantID string) ReadContext { return ReadContext{TenantID: tenantID} }

// InternalRead returns the read context of an internal administrative read.
func InternalRead() ReadContext { return ReadContext{Internal: true} }

// Empty reports whether the context may see nothing at all: it is neither
// internal nor a tenant's, or its tenant ID is one no record can hold
// (longer than MaxIdentifierBytes, or not UTF-8 without NUL), which a
// backend must not send to its store.
func (rc ReadContext) Empty() bool {
	return !rc.Internal && (rc.TenantID == "" || len(rc.TenantID) > MaxIdentifierBytes || !storableText(rc.TenantID))
}

// PossibleCapabilityID reports whether id could name a published
// capability: not empty, at most MaxIdentifierBytes, UTF-8 without NUL. A
// lookup of any other ID finds nothing, and a backend need not ask its
// store (which might refuse the bytes).
func PossibleCapabilityID(id string) bool {
	return id != "" && len(id) <= MaxIdentifierBytes && storableText(id)
}

// CatalogQuery selects catalog definitions. Every filter is optional.
type CatalogQuery struct {
	// CapabilityID keeps only that capability.
	CapabilityID string
	// Text keeps definitions whose "id name description" contains it,
	// case-insensitively. Blank text is ignored.
	Text string
	// Profile keeps definitions whose visible version lists the profile.
	Profile string
	// Cursor continues a previous page (CapabilityPage.NextCursor).
	Cursor string
	// Limit bounds the items; it is clamped to [1, Limits.MaxPageSize].
	Limit int
}

// Validate checks the filters' bounds. Every filter must be UTF-8 without
// NUL characters: no stored record holds other bytes, and a database
// refuses them, so such a filter is the caller's error, not a failure of
// the store.
func (q *CatalogQuery) Validate() error {
	const r = RecordCatalogQuery
	for _, f := range []struct {
		name, v string
		max     int
	}{
		{"capability_id", q.CapabilityID, MaxIdentifierBytes},
		{"text", q.Text, MaxSearchTextBytes},
		{"profile", q.Profile, MaxIdentifierBytes},
	} {
		if len(f.v) > f.max {
			return invalid(r, "", f.name, "is longer than %d bytes", f.max)
		}
		if !storableText(f.v) {
			return invalid(r, "", f.name, "must be UTF-8 without NUL characters")
		}
	}
	if q.Cursor != "" {
		if _, _, err := ParseCursor(q.Cursor); err != nil {
			return err
		}
	}
	return nil
}

// SearchNeedle returns the normalized search text: lower case, trimmed; ""
// when the query has no text filter.
func (q *CatalogQuery) SearchNeedle() string { return strings.ToLower(strings.TrimSpace(q.Text)) }

// SearchText returns the text a definition is searched by: its lower-cased
// "id name description".
func SearchText(d *CapabilityDefinition) string {
	c := &d.Capability
	return strings.ToLower(c.ID + " " + c.Name + " " + c.Description)
}

// CapabilityPage is one page of a catalog read, taken at one catalog
// revision. Total counts every match at that revision, not only this page.
type CapabilityPage struct {
	CatalogRevision uint64                 `json:"catalog_revision"`
	Capabilities    []CapabilityDefinition `json:"capabilities"`
	NextCursor      string                 `json:"next_cursor,omitempty"`
	Total           int                    `json:"total"`
}

// ResolvedCapability is one visible definition and the revision it was read
// at.
type ResolvedCapability struct {
	Definition      CapabilityDefinition `json:"definition"`
	CatalogRevision uint64               `json:"catalog_revision"`
}

// CutPage fills page with the definitions defs yields, in order, each with
// the size of its canonical JSON, until the page holds limit of them or the
// next one would take it past maxBytes; then page.NextCursor continues
// after the last one taken, at catalog revision rev. The definitions are
// cloned. A definition larger than maxBytes on its own cannot be served and
// is ErrStorage.
func CutPage(page *CapabilityPage, rev uint64, limit, maxBytes int, defs iter.Seq2[*CapabilityDefinition, int]) error {
	bytes := 0
	for d, size := range defs {
		if len(page.Capabilities) == limit || bytes+size > maxBytes {
			if len(page.Capabilities) == 0 {
				return fmt.Errorf("%w: capability %s is %d bytes, more than a page of %d bytes holds",
					ErrStorage, d.Capability.ID, size, maxBytes)
			}
			page.NextCursor = Cursor(rev, page.Capabilities[len(page.Capabilities)-1].Capability.ID)
			return nil
		}
		bytes += size
		page.Capabilities = append(page.Capabilities, d.Clone())
	}
	return nil
}

// Cursor returns the continuation cursor "<revision>:<last capability ID>".
func Cursor(revision uint64, lastCapabilityID string) string {
	return strconv.FormatUint(revision, 10) + ":" + lastCapabilityID
}

// ParseCursor splits a cursor. A malformed cursor matches ErrInvalid.
func ParseCursor(c string) (revision uint64, lastCapabilityID string, err error) {
	rev, last, ok := strings.Cut(c, ":")
	if ok {
		revision, err = strconv.ParseUint(rev, 10, 64)
	}
	if !ok || err != nil || !PossibleCapabilityID(last) {
		return 0, "", invalid(RecordCatalogQuery, "", "cursor", "%q is not a cursor this registry issued; restart from the first page", truncate(c))
	}
	return revision, last, nil
}

// CheckCursor parses the query's cursor against the current revision: it
// returns the capability ID to continue after ("" without a cursor), or
// ErrStaleCursor when the catalog has moved on.
func CheckCursor(cursor string, current uint64) (after string, err error) {
	if cursor == "" {
		return "", nil
	}
	rev, last, err := ParseCursor(cursor)
	if err != nil {
		return "", err
	}
	if rev != current {
		return "", ErrStaleCursor
	}
	return last, nil
}
