package main

import "github.com/aipfleet/aipfleet/products/calcom"

func init() { register(calcom.Product) }
