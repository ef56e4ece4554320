package hostsdk_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// notifyStopChild is set in the environment of the child process
// TestNotifyStop starts: the child runs only TestNotifyStopChild.
const notifyStopChild = "AIPFLEET_NOTIFY_STOP_CHILD"

// TestNotifyStop runs a child process that sends itself SIGHUP after
// NotifyStop: started normally, the hangup cancels its context (a drain,
// not the default death); started under nohup, the signal stays ignored
// and the child keeps running.
func TestNotifyStop(t *testing.T) {
	nohup, err := exec.LookPath("nohup")
	if err != nil {
		t.Fatalf("the nohup case needs nohup(1) on PATH: %v", err)
	}
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"plain", []string{os.Args[0]}, "stopped: hangup signal received"},
		{"nohup", []string{nohup, os.Args[0]}, "kept running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The plain child must not inherit an ignored SIGHUP from a
			// suite run under nohup.
			hostsdktest.HangupDefault(t)
			cmd := exec.Command(tc.argv[0], append(tc.argv[1:], "-test.run=^TestNotifyStopChild$", "-test.v")...)
			cmd.Env = append(os.Environ(), notifyStopChild+"=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			if !strings.Contains(string(out), "notify-stop: "+tc.want+"\n") {
				t.Fatalf("child output lacks %q:\n%s", "notify-stop: "+tc.want, out)
			}
		})
	}
}

func TestNotifyStopChild(t *testing.T) {
	if os.Getenv(notifyStopChild) == "" {
		t.Skip("run by TestNotifyStop in a child process")
	}
	ctx, stop := hostsdk.NotifyStop(context.Background())
	defer stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
		os.Stdout.WriteString("notify-stop: stopped: " + context.Cause(ctx).Error() + "\n")
	case <-time.After(2 * time.Second):
		// A signal to the process itself is delivered within
		// microseconds; two seconds without cancellation is the ignored
		// SIGHUP of a nohup start.
		os.Stdout.WriteString("notify-stop: kept running\n")
	}
}
