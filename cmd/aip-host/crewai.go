package main

import "github.com/aipfleet/aipfleet/products/crewai"

func init() { register(crewai.Product) }
