// Package mcpexample holds the process tests of the MCP example: the
// aip-sidecar binary wraps the reference MCP server
// (@modelcontextprotocol/server-everything, installed from the npm registry
// at a pinned version) over stdio and over Streamable HTTP, and the tests
// call its tools through a fleet.
package mcpexample
