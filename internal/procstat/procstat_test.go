package procstat

import (
	"os"
	"testing"
)

func TestRSSOfThisProcess(t *testing.T) {
	kib, err := RSS(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if kib < 1024 {
		t.Fatalf("RSS of this test process = %d KiB, want at least 1 MiB", kib)
	}
	if _, err := RSS(-1); err == nil {
		t.Fatal("RSS of pid -1 succeeded")
	}
}
