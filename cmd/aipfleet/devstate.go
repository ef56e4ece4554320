package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
)

// devURLs are the base URLs of a dev fleet's dispatcher and control plane.
type devURLs struct{ dispatch, control string }

// readDevURLs returns the addresses of the dev fleet whose state directory
// is dir, from the port base dev recorded in its dev.json; ok is false when
// dir holds no dev.json (no dev fleet was started there).
func readDevURLs(dir string) (u devURLs, ok bool, err error) {
	path := filepath.Join(dir, "dev.json")
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return devURLs{}, false, nil
	}
	if err != nil {
		return devURLs{}, false, fmt.Errorf("the dev fleet's state: %w", err)
	}
	var st devState
	if err := json.Unmarshal(raw, &st); err != nil || st.Format != devStateFormat {
		return devURLs{}, false, fmt.Errorf("%s is not a dev state file of this build, so the dev fleet's ports are unknown", path)
	}
	if st.PortBase < 1 || st.PortBase+controlPortOffset > 65535 {
		return devURLs{}, false, fmt.Errorf("%s records port base %d, which is not a port", path, st.PortBase)
	}
	at := func(port int) string { return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
	return devURLs{dispatch: at(st.PortBase), control: at(st.PortBase + controlPortOffset)}, true, nil
}

// devDefaultURL sets *url, the value of the URL flag flagName, to the dev
// fleet's address (which picks from devURLs) when neither the flag nor its
// variable was given and devStateDir holds a dev fleet's state: the client
// commands find aipfleet dev on whatever --port-base it runs. A URL given
// explicitly always wins; without a dev fleet the flag's default stays.
// from is the dev.json the address was read from ("" when it was not), for
// the error when nothing answers there: the state of a dev fleet that is
// no longer running still redirects the commands from their defaults.
// The error of a dev.json that cannot be read names the command as typed
// ("fleet status", flagSet.typed).
func devDefaultURL(fs *flagSet, flagName string, url *string, devStateDir string, which func(devURLs) string) (from string, err error) {
	if fs.isSet(flagName) {
		return "", nil
	}
	u, ok, err := readDevURLs(devStateDir)
	if err != nil {
		return "", usagef("%s: %v; give --%s", fs.typed(), err, flagName)
	}
	if !ok {
		return "", nil
	}
	*url = which(u)
	return filepath.Join(devStateDir, "dev.json"), nil
}

// devAddressNote is what an error about nothing answering at a URL adds
// when the URL came from from, a dev.json, instead of the URL flag
// flagName: where the address came from and what to do.
func devAddressNote(from, flagName string) string {
	return "; that is the address the dev fleet recorded in " + from + ": start it again (aipfleet dev), or give --" + flagName
}

// noDevStateNote explains why a client command used its default address
// or found no dev token: dir, the --dev-state-dir it looked in, holds no
// dev fleet's state. A relative dir is named with the working directory,
// and when a parent of the working directory holds the state instead (the
// command ran in a subdirectory of the one aipfleet dev runs in), the note
// names it and what to do. It is "" when dir does hold a dev.json.
func noDevStateNote(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, "dev.json")); err == nil {
		return ""
	}
	where := dir
	if !filepath.IsAbs(dir) {
		wd, err := os.Getwd()
		if err != nil {
			return "no aipfleet dev fleet's state in " + dir
		}
		where = filepath.Join(wd, dir)
		for parent := filepath.Dir(wd); ; parent = filepath.Dir(parent) {
			found := filepath.Join(parent, dir)
			if _, err := os.Stat(filepath.Join(found, "dev.json")); err == nil && found != where {
				return fmt.Sprintf("no aipfleet dev fleet's state in %s, but there is in %s: run the command in %s, or give --dev-state-dir %s",
					where, found, parent, found)
			}
			if filepath.Dir(parent) == parent {
				break
			}
		}
	}
	return "no aipfleet dev fleet's state in " + where
}
