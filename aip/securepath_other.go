//go:build !unix

package aip

import (
	"fmt"
	"os"
)

// resolvePath: ownership and Unix modes are not checked on this
// platform, so neither are the directories and links of the path.
func resolvePath(path, kind string) (string, os.FileInfo, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", nil, fmt.Errorf("%s %s: %w", kind, path, err)
	}
	return path, info, nil
}
