package main

import "github.com/aipfleet/aipfleet/products/chatwoot"

func init() { register(chatwoot.Product) }
