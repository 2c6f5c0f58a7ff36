// clb-test-apiserver: a real Kubernetes API server for the tests.
//
// It starts an embedded etcd and kube-apiserver (the upstream code, in-process) on free loopback
// ports, writes an admin kubeconfig, prints one line
//
//	ready <kubeconfig-path> <https-url>
//
// on stdout, and runs until stdin closes (the parent died or let go), its parent changes, or it
// gets SIGTERM/SIGINT. Every file it makes lives in one temporary directory, removed on exit,
// and so is the kubeconfig.
// Logs (etcd's and the apiserver's) go to stderr, or to the file given with -log.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/sys/unix"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "where to write the admin kubeconfig (default: <temp dir>/kubeconfig, removed on exit)")
	logPath := flag.String("log", "", "send etcd's and the apiserver's logs to this file instead of stderr")
	verbosity := flag.Int("v", 0, "kube-apiserver log verbosity")
	startTimeout := flag.Duration("start-timeout", 120*time.Second, "give up when /readyz is not ok after this long")
	watchStdin := flag.Bool("watch-stdin", true, "exit when stdin reaches end of file (the parent holds the other end of a pipe)")
	watchParent := flag.Bool("watch-parent", true, "exit when the process that started this one exits (false: outlive the shell, for a walkthrough whose steps run in shells of their own)")
	flag.Parse()

	if *logPath != "" {
		f, err := os.OpenFile(*logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fatalf("open -log %s: %v", *logPath, err)
		}
		// Everything else (klog, zap, panics) writes to fd 2.
		if err := unix.Dup2(int(f.Fd()), 2); err != nil {
			fatalf("redirect stderr to %s: %v", *logPath, err)
		}
	}

	dir, err := os.MkdirTemp("", "clb-test-apiserver-")
	if err != nil {
		fatalf("temp dir: %v", err)
	}
	code := run(dir, *kubeconfig, *verbosity, *startTimeout, *watchStdin, *watchParent)
	os.RemoveAll(dir)
	os.Exit(code)
}

func run(dir, kubeconfig string, verbosity int, startTimeout time.Duration, watchStdin, watchParent bool) int {
	if kubeconfig == "" {
		kubeconfig = filepath.Join(dir, "kubeconfig")
	}

	// ---- etcd ------------------------------------------------------------------------------
	etcdClientPort, etcdPeerPort, apiPort := freePort(), freePort(), freePort()
	etcdURL := mustURL("http://127.0.0.1:" + strconv.Itoa(etcdClientPort))
	peerURL := mustURL("http://127.0.0.1:" + strconv.Itoa(etcdPeerPort))
	cfg := embed.NewConfig()
	cfg.Name = "clb-test"
	cfg.Dir = filepath.Join(dir, "etcd")
	cfg.ListenClientUrls = []url.URL{etcdURL}
	cfg.AdvertiseClientUrls = []url.URL{etcdURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "error"
	cfg.UnsafeNoFsync = true // a test store: speed over durability
	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		errorf("start etcd: %v", err)
		return 1
	}
	defer etcd.Close()
	select {
	case <-etcd.Server.ReadyNotify():
	case err := <-etcd.Err():
		errorf("etcd: %v", err)
		return 1
	case <-time.After(60 * time.Second):
		errorf("etcd not ready after 60s")
		return 1
	}

	// ---- credentials -----------------------------------------------------------------------
	caPEM, certPEM, keyPEM, err := servingCert()
	if err != nil {
		errorf("serving certificate: %v", err)
		return 1
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		errorf("service-account key: %v", err)
		return 1
	}
	saKeyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)})
	token := randomHex(32)
	files := map[string][]byte{
		"serving.crt": append(certPEM, caPEM...),
		"serving.key": keyPEM,
		"sa.key":      saKeyPEM,
		// token,user,uid,"groups": system:masters is cluster-admin under RBAC.
		"tokens.csv": []byte(token + `,clb-test-admin,clb-test-admin,"system:masters"` + "\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			errorf("write %s: %v", name, err)
			return 1
		}
	}

	// ---- kube-apiserver --------------------------------------------------------------------
	serverURL := "https://127.0.0.1:" + strconv.Itoa(apiPort)
	args := []string{
		"--etcd-servers=" + etcdURL.String(),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--tls-cert-file=" + filepath.Join(dir, "serving.crt"),
		"--tls-private-key-file=" + filepath.Join(dir, "serving.key"),
		"--token-auth-file=" + filepath.Join(dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "sa.key"),
		// Dual-stack, so that a test can hold a Service with both IP families.
		"--service-cluster-ip-range=10.96.0.0/16,fd00:10:96::/112",
		// No kubelet, controller-manager or other apiserver: the loopback advertise address
		// must not be written into the kubernetes Service's endpoints.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--v=" + strconv.Itoa(verbosity),
	}
	cmd := app.NewAPIServerCommand() // installs the SIGTERM/SIGINT handler that stops it
	cmd.SetArgs(args)
	apiDone := make(chan error, 1)
	go func() { apiDone <- cmd.Execute() }()

	// ---- ready -----------------------------------------------------------------------------
	client, err := httpClient(caPEM)
	if err != nil {
		errorf("client: %v", err)
		return 1
	}
	deadline := time.Now().Add(startTimeout)
	for {
		if readyz(client, serverURL, token) {
			break
		}
		select {
		case err := <-apiDone:
			errorf("kube-apiserver exited before it was ready: %v", err)
			return 1
		case err := <-etcd.Err():
			errorf("etcd: %v", err)
			return 1
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			errorf("kube-apiserver /readyz not ok after %s", startTimeout)
			stop(apiDone)
			return 1
		}
	}
	if err := writeKubeconfig(kubeconfig, serverURL, caPEM, token); err != nil {
		errorf("write kubeconfig: %v", err)
		stop(apiDone)
		return 1
	}
	defer os.Remove(kubeconfig) // it names a server that is about to be gone
	fmt.Printf("ready %s %s\n", kubeconfig, serverURL)

	// ---- run until the parent lets go ------------------------------------------------------
	stdinClosed := make(chan struct{})
	if watchStdin {
		go func() { io.Copy(io.Discard, os.Stdin); close(stdinClosed) }()
	}
	parent := os.Getppid()
	orphaned := make(chan struct{})
	if watchParent {
		go func() {
			for os.Getppid() == parent {
				time.Sleep(time.Second)
			}
			close(orphaned)
		}()
	}
	select {
	case err := <-apiDone: // SIGTERM/SIGINT, handled by the apiserver's signal context
		if err != nil {
			errorf("kube-apiserver: %v", err)
			return 1
		}
		return 0
	case err := <-etcd.Err():
		errorf("etcd: %v", err)
		stop(apiDone)
		return 1
	case <-stdinClosed:
	case <-orphaned:
	}
	stop(apiDone)
	return 0
}

// stop asks the apiserver to shut down the way a SIGTERM would, and waits a bounded time.
func stop(apiDone <-chan error) {
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case <-apiDone:
	case <-time.After(15 * time.Second):
		errorf("kube-apiserver did not stop within 15s; exiting anyway")
	}
}

func readyz(client *http.Client, serverURL, token string) bool {
	req, _ := http.NewRequest("GET", serverURL+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := client.Do(req.WithContext(ctx))
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode == http.StatusOK && string(body) == "ok"
}

func httpClient(caPEM []byte) (*http.Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("bad CA PEM")
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, nil
}

func writeKubeconfig(path, serverURL string, caPEM []byte, token string) error {
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: clb-test
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: clb-test-admin
  user:
    token: %s
contexts:
- name: clb-test
  context:
    cluster: clb-test
    user: clb-test-admin
    namespace: default
current-context: clb-test
`, serverURL, base64.StdEncoding.EncodeToString(caPEM), token)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// servingCert makes a throwaway CA and a serving certificate it signs for 127.0.0.1 and
// localhost (plus the in-cluster names, which cost nothing).
func servingCert() (caPEM, certPEM, keyPEM []byte, err error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "clb-test-apiserver CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback, net.IPv4(10, 96, 0, 1)},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// freePort asks the kernel for a free loopback port. The port is released before etcd or the
// apiserver binds it, so another process could take it in between; the window is small.
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func mustURL(s string) url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return *u
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

func errorf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "clb-test-apiserver: "+format+"\n", a...)
}

func fatalf(format string, a ...any) {
	errorf(format, a...)
	os.Exit(1)
}
