// Package pythonconnector holds the process tests of the Python notes
// connector (notes_connector.py): the aip-sidecar binary runs it as its
// child in a fleet, and the tests drive it through signed actions, cancel,
// SIGTERM, a crash of the child and a kill -9 of the sidecar.
package pythonconnector
