// Package products holds the built-in product adapters: one package per
// product (calcom for Cal.diy, chatwoot, dify, twenty, hermes, crewai),
// each a hostsdk.Connector that turns AIP actions into calls of the
// product's published HTTP API and, where the product sends webhooks,
// turns verified webhook deliveries into provider events.
//
// cmd/aip-host runs any of them as a connector host: the common host
// flags and AIP_CONNECTOR_HOST_* variables (hostsdk.BindFlags) plus the
// product's own Settings. Every adapter shares the provider client in
// products/internal/provider: redirects are never followed, plain http is
// accepted only for loopback origins, responses are read up to a bound,
// credentials come from owner-only files and never appear in manifests,
// errors or logs, and a mutation whose outcome cannot be known (the
// request may have reached the provider) is journaled outcome_unknown,
// never retried on its own.
package products

import (
	"log/slog"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// Product is one built-in adapter as cmd/aip-host runs it.
type Product struct {
	// Name is the product's argument to aip-host ("chatwoot").
	Name string
	// Summary is one line for aip-host's usage.
	Summary string
	// Settings are the product's own flags and AIP_<PRODUCT>_* variables
	// (read with hostsdk.BindSettings, the flag winning).
	Settings []hostsdk.Setting
	// New builds the connector from the settings' values. Its errors say
	// which setting to fix and match hostsdk.ErrSetting (each adapter's
	// New refuses only its settings: it does no network I/O), so aip-host
	// exits 2 for them, as for a value the settings refused when read.
	// They start with the setting, not with the product's or package's
	// name: aip-host prints them after "aip-host: <product>: ".
	New func(values hostsdk.SettingValues, logger *slog.Logger) (hostsdk.Connector, error)
}
