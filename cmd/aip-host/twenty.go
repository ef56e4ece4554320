package main

import "github.com/aipfleet/aipfleet/products/twenty"

func init() { register(twenty.Product) }
