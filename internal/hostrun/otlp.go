package hostrun

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"strconv"
	"strings"
)

// otlpPrefix starts every variable the OTLP/HTTP trace exporter reads.
const otlpPrefix = "OTEL_EXPORTER_OTLP_"

// checkOTLPSettings refuses the OTEL_EXPORTER_OTLP_* values the OTLP/HTTP
// trace exporter would misread or drop with no more than a log line (a
// malformed endpoint: spans then go to https://localhost:4318; an unknown
// protocol or compression: the default; a timeout in seconds; a header
// without "="; a certificate file it cannot read), or would refuse only
// once started (a certificate with an http:// endpoint). Each variable
// is checked both plain and with TRACES_ (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
// as for the exporter, a value of only spaces is unset. The error names
// the variable and the form it accepts, and matches hostsdk.ErrSetting
// (exit status 2). A header's value, which may be a credential, is never
// shown.
func checkOTLPSettings(getenv func(string) string) error {
	get := func(name string) string { return strings.TrimSpace(getenv(otlpPrefix + name)) }
	for _, signal := range []string{"", "TRACES_"} {
		for _, c := range []struct {
			name  string
			check func(name, v string) error
		}{
			{"ENDPOINT", checkOTLPEndpoint},
			{"PROTOCOL", checkOTLPProtocol},
			{"TIMEOUT", checkOTLPTimeout},
			{"COMPRESSION", checkOTLPCompression},
			{"INSECURE", checkOTLPInsecure},
			{"HEADERS", checkOTLPHeaders},
			{"CERTIFICATE", checkOTLPCertificate},
		} {
			if v := get(signal + c.name); v != "" {
				if err := c.check(otlpPrefix+signal+c.name, v); err != nil {
					return err
				}
			}
		}
		// A client certificate needs its key: the exporter ignores one
		// without the other.
		certVar, keyVar := otlpPrefix+signal+"CLIENT_CERTIFICATE", otlpPrefix+signal+"CLIENT_KEY"
		cert, key := get(signal+"CLIENT_CERTIFICATE"), get(signal+"CLIENT_KEY")
		switch {
		case cert != "" && key == "":
			return Settingf("%s is set but %s is not; set both (the client certificate's PEM file and its key's) or neither", certVar, keyVar)
		case cert == "" && key != "":
			return Settingf("%s is set but %s is not; set both (the client certificate's PEM file and its key's) or neither", keyVar, certVar)
		case cert != "":
			if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
				return Settingf("%s (%s) and %s (%s): %v; want the PEM files of a client certificate and its key", certVar, cert, keyVar, key, err)
			}
		}
	}
	// The exporter refuses TLS files for an endpoint it reaches without
	// TLS, but only as it starts, in words that name no variable.
	endpointVar, endpoint := otlpPrefix+"TRACES_ENDPOINT", get("TRACES_ENDPOINT")
	if endpoint == "" {
		endpointVar, endpoint = otlpPrefix+"ENDPOINT", get("ENDPOINT")
	}
	insecureVar, insecure := otlpPrefix+"TRACES_INSECURE", get("TRACES_INSECURE")
	if insecure == "" {
		insecureVar, insecure = otlpPrefix+"INSECURE", get("INSECURE")
	}
	var tlsVars []string
	for _, name := range []string{"CERTIFICATE", "TRACES_CERTIFICATE", "CLIENT_CERTIFICATE", "TRACES_CLIENT_CERTIFICATE"} {
		if get(name) != "" {
			tlsVars = append(tlsVars, otlpPrefix+name)
		}
	}
	if len(tlsVars) > 0 {
		switch {
		case strings.EqualFold(insecure, "true"):
			return Settingf("%s is true, so spans are sent without TLS, but %s is set; set %s to false, or unset %s", insecureVar, strings.Join(tlsVars, " and "), insecureVar, strings.Join(tlsVars, " and "))
		case insecure == "" && strings.HasPrefix(strings.ToLower(endpoint), "http://"):
			return Settingf("%s is an http:// URL, which is reached without TLS, but %s is set; use an https:// URL, or unset %s", endpointVar, strings.Join(tlsVars, " and "), strings.Join(tlsVars, " and "))
		}
	}
	return nil
}

// checkOTLPEndpoint: an http or https URL with a host; the exporter drops
// what it cannot parse and sends to https://localhost:4318 instead.
func checkOTLPEndpoint(name, v string) error {
	form := "an http:// or https:// URL of the collector's OTLP/HTTP receiver, such as http://otel-collector:4318"
	if strings.Contains(name, "TRACES_") {
		form = "the http:// or https:// URL spans are posted to, path included, such as http://otel-collector:4318/v1/traces"
	}
	u, err := url.Parse(v)
	if err != nil {
		// url's error quotes the value: say what is wrong once.
		reason := err.Error()
		if ue, ok := err.(*url.Error); ok {
			reason = ue.Err.Error()
		}
		return Settingf("%s is %q, which is not a URL (%s); want %s", name, v, reason, form)
	}
	scheme := strings.ToLower(u.Scheme)
	switch {
	case scheme != "http" && scheme != "https":
		return Settingf("%s is %q, which has no http:// or https:// scheme; want %s", name, v, form)
	case u.Hostname() == "":
		return Settingf("%s is %q, which names no host; want %s", name, v, form)
	case u.User != nil:
		return Settingf("%s holds a user or password, which the exporter does not send; give credentials in %sHEADERS, and want %s", name, otlpPrefix, form)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return Settingf("%s is %q, whose port is not from 1 to 65535; want %s", name, v, form)
		}
	}
	return nil
}

// checkOTLPProtocol: the exporter speaks OTLP over HTTP; it reads any
// other value as http/protobuf.
func checkOTLPProtocol(name, v string) error {
	switch v {
	case "http/protobuf", "http/json":
		return nil
	case "grpc":
		return Settingf("%s is \"grpc\", but this program exports spans over OTLP/HTTP only; set it to http/protobuf (or unset it) and point the endpoint at the collector's OTLP/HTTP port (4318 by default)", name)
	}
	return Settingf("%s is %q; want http/protobuf (the default) or http/json", name, v)
}

// checkOTLPTimeout: whole milliseconds; the exporter ignores "10s".
func checkOTLPTimeout(name, v string) error {
	if n, err := strconv.Atoi(v); err != nil || n < 0 {
		return Settingf("%s is %q; want a whole number of milliseconds, such as 10000 for 10 seconds (the default)", name, v)
	}
	return nil
}

// checkOTLPCompression: the exporter reads anything but gzip as none.
func checkOTLPCompression(name, v string) error {
	if v != "gzip" && v != "none" {
		return Settingf("%s is %q; want gzip or none", name, v)
	}
	return nil
}

// checkOTLPInsecure: the exporter reads anything but true as false.
func checkOTLPInsecure(name, v string) error {
	if !strings.EqualFold(v, "true") && !strings.EqualFold(v, "false") {
		return Settingf("%s is %q; want true or false", name, v)
	}
	return nil
}

// checkOTLPHeaders: comma-separated KEY=VALUE pairs whose values are
// percent-encoded; the exporter drops a pair it cannot read. A value may
// be a credential: only the pair's position and key are shown.
func checkOTLPHeaders(name, v string) error {
	const form = "comma-separated KEY=VALUE pairs with the values percent-encoded, such as api-key=abc%2C123,tenant=acme"
	for i, pair := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		switch {
		case !ok:
			return Settingf("%s: pair %d has no \"=\"; want %s", name, i+1, form)
		case !isHeaderName(k):
			return Settingf("%s: pair %d has the key %q, which is not an HTTP header name; want %s", name, i+1, k, form)
		}
		if _, err := url.PathUnescape(val); err != nil {
			return Settingf("%s: the value of %s (pair %d) has a %% not followed by two hex digits; want %s", name, k, i+1, form)
		}
	}
	return nil
}

// isHeaderName reports whether k is an HTTP token, as the exporter checks.
func isHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for _, c := range k {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("!#$%&'*+-.^_`|~", c)
		if !ok {
			return false
		}
	}
	return true
}

// checkOTLPCertificate: a readable PEM file of CA certificates; the
// exporter ignores one it cannot read and trusts the system's CAs.
func checkOTLPCertificate(name, v string) error {
	b, err := os.ReadFile(v)
	if err != nil {
		return Settingf("%s: %v; want the PEM file of the CA certificates the collector's certificate chains to", name, err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return Settingf("%s: %s holds no PEM certificate; want the PEM file of the CA certificates the collector's certificate chains to", name, v)
	}
	return nil
}
