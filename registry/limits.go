package registry

// Limits bound what the registry accepts and returns (reference §3.4). A
// zero field means its default; backends take Limits in their Config and
// apply WithDefaults.
type Limits struct {
	// MaxCapabilitiesPerVersion bounds the capabilities of one manifest.
	// Defaults to 512.
	MaxCapabilitiesPerVersion int
	// MaxManifestBytes bounds a manifest's canonical JSON. Defaults to 4 MiB.
	MaxManifestBytes int
	// MaxCapabilityBytes bounds one capability definition's canonical JSON.
	// Defaults to 256 KiB.
	MaxCapabilityBytes int
	// MaxPageSize bounds the items of one catalog page; a query's limit is
	// clamped to [1, MaxPageSize]. Defaults to 200.
	MaxPageSize int
	// MaxPageBytes bounds the summed canonical JSON of one page's definitions.
	// Defaults to 4 MiB.
	MaxPageBytes int
}

// Default limits.
const (
	DefaultMaxCapabilitiesPerVersion = 512
	DefaultMaxManifestBytes          = 4 << 20
	DefaultMaxCapabilityBytes        = 256 << 10
	DefaultMaxPageSize               = 200
	DefaultMaxPageBytes              = 4 << 20
)

// Fixed bounds on strings the registry stores or is queried with.
const (
	// MaxIdentifierBytes bounds identifiers, references and labels: record
	// IDs, tenant and capability IDs, policy and secret references, version
	// strings, profiles and cursors' capability part.
	MaxIdentifierBytes = 256
	// MaxSearchTextBytes bounds a catalog query's search text.
	MaxSearchTextBytes = 1024
	// MaxEndpointBytes bounds a replica endpoint URL.
	MaxEndpointBytes = 2048
	// MaxTopologyLabelBytes bounds a region, zone or capacity class label.
	MaxTopologyLabelBytes = 128
)

// DefaultLimits returns the reference defaults.
func DefaultLimits() Limits { return Limits{}.WithDefaults() }

// WithDefaults returns l with every zero field set to its default.
func (l Limits) WithDefaults() Limits {
	if l.MaxCapabilitiesPerVersion == 0 {
		l.MaxCapabilitiesPerVersion = DefaultMaxCapabilitiesPerVersion
	}
	if l.MaxManifestBytes == 0 {
		l.MaxManifestBytes = DefaultMaxManifestBytes
	}
	if l.MaxCapabilityBytes == 0 {
		l.MaxCapabilityBytes = DefaultMaxCapabilityBytes
	}
	if l.MaxPageSize == 0 {
		l.MaxPageSize = DefaultMaxPageSize
	}
	if l.MaxPageBytes == 0 {
		l.MaxPageBytes = DefaultMaxPageBytes
	}
	return l
}

// Validate checks that every bound is positive and that one capability
// definition always fits in a page.
func (l Limits) Validate() error {
	l = l.WithDefaults()
	switch {
	case l.MaxCapabilitiesPerVersion < 1, l.MaxManifestBytes < 1, l.MaxCapabilityBytes < 1, l.MaxPageSize < 1, l.MaxPageBytes < 1:
		return invalidLimits("every limit must be positive")
	case l.MaxCapabilityBytes > l.MaxPageBytes:
		return invalidLimits("MaxCapabilityBytes must not exceed MaxPageBytes, or a definition could never be returned")
	}
	return nil
}

// ClampPageSize returns limit clamped to [1, MaxPageSize].
func (l Limits) ClampPageSize(limit int) int {
	l = l.WithDefaults()
	return min(max(limit, 1), l.MaxPageSize)
}

func invalidLimits(reason string) error {
	return &FieldError{Err: ErrInvalid, Record: "limits", Reason: reason}
}
