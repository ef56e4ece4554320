package main

import "github.com/aipfleet/aipfleet/products/dify"

func init() { register(dify.Product) }
