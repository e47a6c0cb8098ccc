// Command workload is the cluster lane's only container program (e2e/cluster): the pause image's
// sandbox process and the test Pods' server and client, one static binary so that both images are
// built from scratch here without a registry (hack/cluster/images.sh).
//
//	workload pause                 hold the Pod sandbox's namespaces; reap orphans until SIGTERM
//	workload serve ADDR            TCP and UDP echo on ADDR: answers each line (TCP) or datagram (UDP)
//	                               with "<NAME> <line>", NAME from $NNM_NAME or the hostname
//	workload connect ADDR TIMEOUT  dial ADDR over TCP, send "ping", print the answer; exit 1 on an
//	                               error or no answer within TIMEOUT (a Go duration)
//	workload resetclient ADDR WAIT the connection-reset reproduction's client (e2e/cluster): dial
//	                               ADDR, send "ping", read "pong"; WAIT later send "after" and print
//	                               the server's answer or the error ("connection reset by peer")
//	workload hold ADDR             dial ADDR over TCP and hold the connection: a line and its answer
//	                               every 200 ms until stdin ends (kubectl exec -i; the test closes
//	                               it), then print how many; exit 1 at the first failed round trip
//	workload download ADDR N TIMEOUT
//	                               dial ADDR over TCP, send "get N", read N bytes; print how many
//	                               arrived and how long it took; exit 1 when fewer within TIMEOUT
//	workload scrape URL TOKENFILE  GET URL over HTTPS (the agent's self-signed certificate is not
//	                               verified) with the bearer token read from TOKENFILE ("-": none);
//	                               print "status N" and the body
package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fail("usage: workload pause | serve ADDR | connect ADDR TIMEOUT")
	}
	switch args := os.Args[2:]; os.Args[1] {
	case "pause":
		pause()
	case "serve":
		need(args, 1)
		serve(args[0])
	case "connect":
		need(args, 2)
		d, err := time.ParseDuration(args[1])
		if err != nil {
			fail("connect: timeout %q: %v", args[1], err)
		}
		if err := connect(args[0], d); err != nil {
			fail("connect %s: %v", args[0], err)
		}
	case "resetclient":
		need(args, 2)
		d, err := time.ParseDuration(args[1])
		if err != nil {
			fail("resetclient: wait %q: %v", args[1], err)
		}
		resetClient(args[0], d)
	case "hold":
		need(args, 1)
		hold(args[0])
	case "download":
		need(args, 3)
		n, err := strconv.Atoi(args[1])
		if err != nil {
			fail("download: size %q: %v", args[1], err)
		}
		d, err := time.ParseDuration(args[2])
		if err != nil {
			fail("download: timeout %q: %v", args[2], err)
		}
		download(args[0], n, d)
	case "scrape":
		need(args, 2)
		scrape(args[0], args[1])
	default:
		fail("unknown command %q", os.Args[1])
	}
}

func need(args []string, n int) {
	if len(args) != n {
		fail("%s needs %d argument(s), got %d", os.Args[1], n, len(args))
	}
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "workload: "+format+"\n", a...)
	os.Exit(1)
}

// pause is what the sandbox's process does: nothing but reaping (it is the Pod's PID 1 when the
// Pod shares one PID namespace) until the runtime stops it.
func pause() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}

func name() string {
	if n := os.Getenv("NNM_NAME"); n != "" {
		return n
	}
	n, _ := os.Hostname()
	return n
}

func serve(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fail("serve: %v", err)
	}
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		fail("serve: %v", err)
	}
	me := name()
	fmt.Printf("serving TCP and UDP on %s as %s\n", addr, me)
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := u.ReadFrom(buf)
			if err != nil {
				fail("serve udp: %v", err)
			}
			_, _ = u.WriteTo([]byte(me+" "+strings.TrimSpace(string(buf[:n]))+"\n"), from)
		}
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			fail("serve tcp: %v", err)
		}
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				if _, err := fmt.Fprintf(c, "%s %s\n", me, sc.Text()); err != nil {
					return
				}
			}
		}()
	}
}

func connect(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(c, "ping"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("no answer: %w", err)
	}
	fmt.Print(line)
	return nil
}

func resetClient(addr string, wait time.Duration) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		fail("resetclient: %v", err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintln(c, "ping"); err != nil {
		fail("resetclient: %v", err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "pong\n" {
		fail("resetclient: want pong, got %q, %v", line, err)
	}
	fmt.Printf("connected from %s, got pong\n", c.LocalAddr())
	time.Sleep(wait)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintln(c, "after"); err != nil {
		fmt.Printf("after: write: %v\n", err)
		return
	}
	line, err := r.ReadString('\n')
	if err != nil {
		fmt.Printf("after: read: %v\n", err)
		return
	}
	fmt.Printf("after: answer %q\n", strings.TrimSpace(line))
}

func hold(addr string) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		fail("hold: %v", err)
	}
	defer c.Close()
	fmt.Printf("holding %s from %s\n", addr, c.LocalAddr())
	stop := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stop)
	}()
	r := bufio.NewReader(c)
	start := time.Now()
	for n := 1; ; n++ {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintf(c, "hold %d\n", n); err != nil {
			fail("hold: round trip %d after %v: %v", n, time.Since(start).Round(time.Millisecond), err)
		}
		if _, err := r.ReadString('\n'); err != nil {
			fail("hold: round trip %d after %v: %v", n, time.Since(start).Round(time.Millisecond), err)
		}
		select {
		case <-stop:
			fmt.Printf("held %d round trips over %v, none failed\n", n, time.Since(start).Round(time.Second))
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func scrape(url, tokenFile string) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		fail("scrape: %v", err)
	}
	if tokenFile != "-" {
		tok, err := os.ReadFile(tokenFile)
		if err != nil {
			fail("scrape: %v", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, // the agent's certificate is self-signed
	}}
	resp, err := client.Do(req)
	if err != nil {
		fail("scrape: %v", err)
	}
	defer resp.Body.Close()
	fmt.Printf("status %d\n", resp.StatusCode)
	_, _ = io.Copy(os.Stdout, resp.Body)
}

func download(addr string, n int, timeout time.Duration) {
	start := time.Now()
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		fail("download: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(start.Add(timeout))
	if _, err := fmt.Fprintf(c, "get %d\n", n); err != nil {
		fail("download: %v", err)
	}
	got, err := io.Copy(io.Discard, io.LimitReader(c, int64(n)))
	if got < int64(n) {
		fail("download: received %d of %d bytes in %v: %v", got, n, time.Since(start).Round(time.Millisecond), err)
	}
	fmt.Printf("received %d of %d bytes in %v\n", got, n, time.Since(start).Round(time.Millisecond))
}
