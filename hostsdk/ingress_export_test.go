package hostsdk

// IngressPeers is the number of peers that hold or wait for part of h's
// ingress read budget.
func IngressPeers(h *Host) int { return h.ingressBudget.Stats().Peers }
