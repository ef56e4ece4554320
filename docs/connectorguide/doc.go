// Package connectorguide holds the code of docs/connector-guide.md: the
// notes connector (package notes), its host program (noteshost), and the
// test that keeps the guide true: every code block the guide quotes is the
// code here, its fleet file admits exactly the manifest the host serves,
// and its host command agrees with the fleet file.
package connectorguide
