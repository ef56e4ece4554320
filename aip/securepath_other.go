//go:build !unix

package aip

import "os"

// resolvePath: ownership and Unix modes are not checked on this
// platform, so neither are the directories and links of the path.
func resolvePath(path, kind string) (string, os.FileInfo, error) {
	info, err := os.Stat(path)
	if err != nil {
		return "", nil, fileError(kind, path, err)
	}
	return path, info, nil
}
