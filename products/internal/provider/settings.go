package provider

import (
	"log/slog"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// FromSettings returns newConn as a products.Product's New: every error
// it returns (an adapter's refusal of its settings: a URL, a file or a
// value it cannot use) matches hostsdk.ErrSetting, with newConn's text,
// so that aip-host exits 2 for it, as for a value hostsdk's settings
// refuse: a mistake in how the replica was started, not a failed start.
func FromSettings[C hostsdk.Connector](newConn func(hostsdk.SettingValues, *slog.Logger) (C, error)) func(hostsdk.SettingValues, *slog.Logger) (hostsdk.Connector, error) {
	return func(values hostsdk.SettingValues, logger *slog.Logger) (hostsdk.Connector, error) {
		conn, err := newConn(values, logger)
		if err != nil {
			return nil, &settingRefused{err}
		}
		return conn, nil
	}
}

// settingRefused is an adapter's refusal of its settings: err's text,
// matching err and hostsdk.ErrSetting.
type settingRefused struct{ err error }

func (e *settingRefused) Error() string   { return e.err.Error() }
func (e *settingRefused) Unwrap() []error { return []error{e.err, hostsdk.ErrSetting} }
