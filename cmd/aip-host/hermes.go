package main

import "github.com/aipfleet/aipfleet/products/hermes"

func init() { register(hermes.Product) }
