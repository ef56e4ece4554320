//go:build unix

package aip

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// Files of the local user and group databases privateGroup reads (tests
// point them elsewhere).
var (
	passwdFile = "/etc/passwd"
	groupFile  = "/etc/group"
)

// privateGroupDir reports whether a directory that is writable by its
// group but not by others is writable by its owner alone all the same:
// its group is the owner's private group (the user-private-group scheme of
// Debian, Ubuntu, Fedora and RHEL, whose users' umask 002 makes every
// directory they create 0775). Like Debian's OpenSSH ("harmless group
// writability"), it asks the local databases: the group must be listed in
// /etc/group with no member but the owner, and no user in /etc/passwd but
// the owner may have it as primary group. A group or user only a directory
// service (LDAP, sssd) knows is not seen, so a group missing from
// /etc/group is not private.
func privateGroupDir(info os.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || info.Mode().Perm()&0o002 != 0 {
		return false
	}
	return privateGroup(uint32(st.Gid), uint32(st.Uid))
}

// privateGroup reports whether group gid has no possible member but user
// uid in the local databases.
func privateGroup(gid, uid uint32) bool {
	owner, primaryOthers, ok := scanPasswd(gid, uid)
	if !ok || owner == "" || primaryOthers {
		return false
	}
	members, found := groupMembers(gid)
	if !found {
		return false
	}
	for _, m := range members {
		if m != "" && m != owner {
			return false
		}
	}
	return true
}

// scanPasswd returns the name of user uid and whether another user has
// gid as primary group; ok is false when the file cannot be read.
func scanPasswd(gid, uid uint32) (owner string, primaryOthers, ok bool) {
	f, err := os.Open(passwdFile)
	if err != nil {
		return "", false, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// name:password:uid:gid:gecos:home:shell
		line := sc.Text()
		if strings.HasPrefix(line, "+") || strings.HasPrefix(line, "-") {
			// NIS compat entries: users this file does not list may
			// have the group as primary.
			primaryOthers = true
			continue
		}
		fields := strings.Split(line, ":")
		if len(fields) < 4 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		u, err1 := strconv.ParseUint(fields[2], 10, 32)
		g, err2 := strconv.ParseUint(fields[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		switch {
		case uint32(u) == uid && owner == "":
			owner = fields[0]
		case uint32(g) == gid && uint32(u) != uid:
			primaryOthers = true
		}
	}
	if sc.Err() != nil {
		return "", false, false
	}
	return owner, primaryOthers, true
}

// groupMembers returns the member list of group gid in /etc/group, and
// whether the group is listed there.
func groupMembers(gid uint32) ([]string, bool) {
	f, err := os.Open(groupFile)
	if err != nil {
		return nil, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// name:password:gid:member,member
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 4 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if g, err := strconv.ParseUint(fields[2], 10, 32); err == nil && uint32(g) == gid {
			return strings.Split(fields[3], ","), true
		}
	}
	return nil, false
}
