package recvloop

import (
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// socketpair returns a datagram socket pair whose first end has a short receive timeout.
func socketpair(t *testing.T) (rd, wr int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	tv := unix.NsecToTimeval((10 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fds[0], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return fds[0], fds[1]
}

// Each datagram reaches got whole; got returning false ends the loop.
func TestRunHandsOverDatagrams(t *testing.T) {
	rd, wr := socketpair(t)
	for _, s := range []string{"one", "two", "three"} {
		if _, err := unix.Write(wr, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	Run(rd, make([]byte, 64), make(chan struct{}), func(msg []byte, _ unix.Sockaddr, err error) bool {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(msg))
		return len(got) < 3
	})
	if len(got) != 3 || got[0] != "one" || got[1] != "two" || got[2] != "three" {
		t.Errorf("got %q, want one, two, three", got)
	}
}

// Timeouts are not handed over: a closed stop ends a loop that reads nothing.
func TestRunStopsWhileIdle(t *testing.T) {
	rd, _ := socketpair(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(rd, make([]byte, 64), stop, func(msg []byte, _ unix.Sockaddr, err error) bool {
			t.Errorf("got called: %q, %v", msg, err)
			return true
		})
	}()
	time.Sleep(50 * time.Millisecond) // several timeouts
	close(stop)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not notice the closed stop")
	}
}

// Other errors reach got, with no message.
func TestRunHandsOverErrors(t *testing.T) {
	var gotErr error
	Run(-1, make([]byte, 64), make(chan struct{}), func(msg []byte, _ unix.Sockaddr, err error) bool {
		if msg != nil {
			t.Errorf("msg %q with an error", msg)
		}
		gotErr = err
		return false
	})
	if !errors.Is(gotErr, unix.EBADF) {
		t.Errorf("err = %v, want EBADF", gotErr)
	}
}
