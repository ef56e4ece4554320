package controlplane

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"sync"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// replicaKeys caches each replica's peer DID and public key. A replica's DID
// is part of its fixed identity (registry.CheckReplicaUpdate refuses to
// change it) and replicas are never deleted, so an entry never goes stale;
// only found replicas are cached. The cache is dropped whole when full.
type replicaKeys struct {
	store registry.Lifecycle
	max   int
	mu    sync.RWMutex
	m     map[string]replicaKey
}

type replicaKey struct {
	did string
	pub ed25519.PublicKey
}

func newReplicaKeys(store registry.Lifecycle, max int) *replicaKeys {
	return &replicaKeys{store: store, max: max, m: make(map[string]replicaKey)}
}

// get returns the replica's key; registry.ErrNotFound (wrapped) when the
// replica is not pre-provisioned.
func (k *replicaKeys) get(ctx context.Context, replicaID string) (replicaKey, error) {
	k.mu.RLock()
	e, ok := k.m[replicaID]
	k.mu.RUnlock()
	if ok {
		return e, nil
	}
	rep, err := k.store.LifecycleReplica(ctx, replicaID)
	if err != nil {
		return replicaKey{}, err
	}
	pub, err := aip.ParseDIDKey(rep.PeerDID)
	if err != nil {
		return replicaKey{}, fmt.Errorf("%w: replica %s has no usable peer DID: %v", registry.ErrInvalid, replicaID, err)
	}
	e = replicaKey{did: rep.PeerDID, pub: pub}
	k.mu.Lock()
	if len(k.m) >= k.max {
		clear(k.m)
	}
	k.m[replicaID] = e
	k.mu.Unlock()
	return e, nil
}
