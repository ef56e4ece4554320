package aip

import (
	"fmt"
	"strings"
)

// reasonError is an error of this package as a person reads it. It
// matches its sentinel (errors.Is(err, ErrUnsafeFile) and so on), but its
// text leaves out the sentinel's "aip: " prefix, which tells a program
// where the error comes from and the person who has to fix the file, key
// or identifier nothing.
type reasonError struct {
	sentinel error
	text     string
}

// Error implements error.
func (e *reasonError) Error() string { return e.text }

// Unwrap returns the sentinel.
func (e *reasonError) Unwrap() error { return e.sentinel }

// reasonf returns an error matching sentinel whose text is the formatted
// reason alone: a sentence that names the thing and says what is wrong
// ("secret file k is accessible by group or others (mode 0644); chmod 600
// it").
func reasonf(sentinel error, format string, args ...any) error {
	return &reasonError{sentinel: sentinel, text: fmt.Sprintf(format, args...)}
}

// labelf returns an error matching sentinel whose text is the sentinel's
// without the package prefix, then the formatted detail ("invalid signing
// key: seed is not hexadecimal: ..."), for details that do not say on
// their own what they are about.
func labelf(sentinel error, format string, args ...any) error {
	return &reasonError{sentinel: sentinel, text: strings.TrimPrefix(sentinel.Error(), "aip: ") + ": " + fmt.Sprintf(format, args...)}
}
