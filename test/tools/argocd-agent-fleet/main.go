// argocd-agent-fleet: the load generator of `bench-grpc fleet-compare` for
// argocd-agent, the counterpart of argocd-pull's own fleet load generator
// (spoke-agent/examples/bench-grpc/fleet_load_generator.rs).
//
// It is argocd-pull's code, not argocd-agent's: test/tools/build-argocd-agent.sh
// builds it inside a temporary copy of argocd-agent's source tree (it needs
// that module's internal packages), and nothing of argocd-agent enters the
// argocd-pull repository.
//
// It runs --agents instances of argocd-agent's own agent (its `agent`
// package, managed mode, mTLS with one client certificate each) in one
// process against one principal. What an agent does not get is a cluster:
// each has in-memory clientsets (client-go's and Argo CD's fake clientsets)
// instead of an API server, and this program plays each cluster's Argo CD
// by giving every Application the agent creates a synced, healthy status at
// once (and again whenever something else changes it), as argocd-pull's
// load generator does for its simulated agents.
//
// Every 500 ms it prints one JSON line on stdout:
//
//	{"agents":1000,"started":1000,"connected":998,"apps":9980,"statuses":9980}
//
// connected: agents whose stream to the principal is up; apps: Applications
// the agents hold; statuses: those showing the status this program gave them.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/argoproj-labs/argocd-agent/agent"
	"github.com/argoproj-labs/argocd-agent/internal/auth"
	"github.com/argoproj-labs/argocd-agent/internal/kube"
	"github.com/argoproj-labs/argocd-agent/pkg/client"
	"github.com/argoproj-labs/argocd-agent/pkg/types"
	"github.com/argoproj/argo-cd/gitops-engine/pkg/health"
	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	appclient "github.com/argoproj/argo-cd/v3/pkg/client/clientset/versioned"
	fakeappclient "github.com/argoproj/argo-cd/v3/pkg/client/clientset/versioned/fake"
	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/watch"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

type options struct {
	server, ca, certs, namespace, redis, prefix string
	port, agents, concurrency                   int
}

// One simulated cluster: its agent and its in-memory Applications.
type cluster struct {
	name  string
	agent *agent.Agent
	apps  appclient.Interface
	// Applications held, and those showing the status given to them.
	held, showing atomic.Int64
}

// The health message this cluster's Argo CD gives Application `app`; the
// benchmark looks for it on the hub copy.
func message(cluster, app string) string {
	return fmt.Sprintf("synced by %s/%s", cluster, app)
}

func main() {
	var o options
	flag.StringVar(&o.server, "server", "127.0.0.1", "the principal's address")
	flag.IntVar(&o.port, "port", 0, "the principal's port")
	flag.StringVar(&o.ca, "ca", "", "CA of the principal's serving certificate")
	flag.StringVar(&o.certs, "certs", "", "directory of <agent>.crt and <agent>.key, the agents' client certificates (CN = agent name)")
	flag.StringVar(&o.namespace, "namespace", "argocd-agent", "the agents' namespace on their (in-memory) clusters")
	flag.StringVar(&o.redis, "redis", "", "redis address the agents' cluster caches use")
	flag.StringVar(&o.prefix, "prefix", "cluster-", "agent names are <prefix>0001, <prefix>0002, ...")
	flag.IntVar(&o.agents, "agents", 1, "agents to run")
	flag.IntVar(&o.concurrency, "start-concurrency", 64, "agents started at once")
	flag.Parse()
	// Every watch the object tracker opens holds DefaultChanSize events
	// (100) and panics ("channel full") when one more comes before its
	// reader ran: with 1,000 agents' goroutines on two cores the relays
	// below are sometimes not scheduled for that long (issue 37's re-run
	// lost two rounds of four to it). 4,096 events of 32 bytes is 128 KiB
	// per watch, created with it.
	watch.DefaultChanSize = 4096
	// The agents' own logs: warnings and errors only, on stderr.
	logrus.SetLevel(logrus.WarnLevel)
	logrus.SetOutput(os.Stderr)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	clusters := make([]atomic.Pointer[cluster], o.agents)
	var started atomic.Int64
	go report(ctx, clusters, &started, o.agents)

	sem := make(chan struct{}, o.concurrency)
	var wg sync.WaitGroup
	for i := range clusters {
		name := fmt.Sprintf("%s%04d", o.prefix, i+1)
		sem <- struct{}{}
		wg.Add(1)
		go func(i int) {
			defer func() { <-sem; wg.Done() }()
			c, err := start(ctx, o, name)
			if err != nil {
				fmt.Fprintf(os.Stderr, "argocd-agent-fleet: agent %s: %v\n", name, err)
				os.Exit(1)
			}
			clusters[i].Store(c)
			started.Add(1)
		}(i)
	}
	wg.Wait()
	<-ctx.Done()
}

// start builds and starts agent `name` with an in-memory cluster, and its
// cluster's Argo CD.
func start(ctx context.Context, o options, name string) (*cluster, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.namespace}}
	kc := kubefake.NewSimpleClientset(ns)
	apps := fakeappclient.NewSimpleClientset()
	versions(&kc.Fake, kc.Tracker())
	versions(&apps.Fake, apps.Tracker())
	kubeClient := kube.NewKubernetesClient(ctx, kc, apps, o.namespace)
	// The agent builds a dynamic client from this config to read back what
	// it holds when it resyncs; it is served from the same in-memory
	// clientsets, and nothing is ever dialled.
	kubeClient.RestConfig = &rest.Config{Host: "http://in-memory.invalid", Transport: &inMemory{kube: kc, apps: apps}}
	remote, err := client.NewRemote(o.server, o.port,
		client.WithAuth("mtls", auth.Credentials{}),
		client.WithRootAuthoritiesFromFile(o.ca),
		client.WithTLSClientCertFromFile(filepath.Join(o.certs, name+".crt"), filepath.Join(o.certs, name+".key")),
		client.WithClientMode(types.AgentModeManaged),
		client.WithAgentNamespace(o.namespace),
	)
	if err != nil {
		return nil, fmt.Errorf("remote: %w", err)
	}
	// The agent command's defaults, without its metrics and health ports
	// (one process holds them all).
	a, err := agent.NewAgent(ctx, kubeClient, o.namespace,
		agent.WithRemote(remote),
		agent.WithMode(types.AgentModeManaged.String()),
		agent.WithRedisHost(o.redis),
		agent.WithEnableResourceProxy(false),
		agent.WithCacheRefreshInterval(10*time.Second),
		agent.WithInformerSyncTimeout(10*time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	c := &cluster{name: name, agent: a, apps: apps}
	// The watch is open before the agent can create anything.
	w, err := apps.ArgoprojV1alpha1().Applications(o.namespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("watch: %w", err)
	}
	go c.argocd(ctx, o.namespace, w)
	if err := a.Start(ctx); err != nil {
		return nil, fmt.Errorf("start: %w", err)
	}
	return c, nil
}

// argocd plays the cluster's Argo CD: every Application not showing the
// status it should gets it at once.
func (c *cluster) argocd(ctx context.Context, ns string, w watch.Interface) {
	defer w.Stop()
	showing := map[string]bool{}
	for {
		var ev watch.Event
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.ResultChan():
			if !ok {
				return
			}
			ev = e
		}
		app, ok := ev.Object.(*v1alpha1.Application)
		if !ok {
			continue
		}
		was, known := showing[app.Name]
		if ev.Type == watch.Deleted {
			if known {
				delete(showing, app.Name)
				c.held.Add(-1)
				if was {
					c.showing.Add(-1)
				}
			}
			continue
		}
		if !known {
			c.held.Add(1)
		}
		want := message(c.name, app.Name)
		ok = app.Status.Health.Status == health.HealthStatusHealthy && app.Status.Health.Message == want &&
			app.Status.Sync.Status == v1alpha1.SyncStatusCodeSynced
		if ok && !was {
			c.showing.Add(1)
		} else if !ok && was {
			c.showing.Add(-1)
		}
		showing[app.Name] = ok
		if ok {
			continue
		}
		given := app.DeepCopy()
		given.Status.Health = v1alpha1.AppHealthStatus{Status: health.HealthStatusHealthy, Message: want}
		given.Status.Sync = v1alpha1.SyncStatus{Status: v1alpha1.SyncStatusCodeSynced, Revision: "fleet"}
		if _, err := c.apps.ArgoprojV1alpha1().Applications(ns).Update(ctx, given, metav1.UpdateOptions{}); err != nil {
			fmt.Fprintf(os.Stderr, "argocd-agent-fleet: %s: status of %s: %v\n", c.name, app.Name, err)
		}
	}
}

type line struct {
	Agents    int   `json:"agents"`
	Started   int64 `json:"started"`
	Connected int   `json:"connected"`
	Apps      int64 `json:"apps"`
	Statuses  int64 `json:"statuses"`
}

func report(ctx context.Context, clusters []atomic.Pointer[cluster], started *atomic.Int64, n int) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	out := json.NewEncoder(os.Stdout)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l := line{Agents: n, Started: started.Load()}
		for i := range clusters {
			c := clusters[i].Load()
			if c == nil {
				continue
			}
			if c.agent.IsConnected() {
				l.Connected++
			}
			l.Apps += c.held.Load()
			l.Statuses += c.showing.Load()
		}
		_ = out.Encode(l)
	}
}

// inMemory answers the dynamic client's GETs of one namespaced object from
// the in-memory clientsets; anything else is refused.
type inMemory struct {
	kube *kubefake.Clientset
	apps *fakeappclient.Clientset
}

// Kinds of the resources the agent reads back.
var kinds = map[string]string{
	"applications": "Application", "appprojects": "AppProject",
	"secrets": "Secret", "configmaps": "ConfigMap",
}

func (m *inMemory) RoundTrip(r *http.Request) (*http.Response, error) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var gvr schema.GroupVersionResource
	var ns, name string
	switch {
	case len(parts) == 6 && parts[0] == "api" && parts[2] == "namespaces":
		gvr, ns, name = schema.GroupVersionResource{Version: parts[1], Resource: parts[4]}, parts[3], parts[5]
	case len(parts) == 7 && parts[0] == "apis" && parts[3] == "namespaces":
		gvr, ns, name = schema.GroupVersionResource{Group: parts[1], Version: parts[2], Resource: parts[5]}, parts[4], parts[6]
	}
	kind, known := kinds[gvr.Resource]
	if r.Method != http.MethodGet || !known {
		return answer(r, http.StatusMethodNotAllowed, apierrors.NewMethodNotSupported(gvr.GroupResource(), r.Method).Status())
	}
	tracker := m.kube.Tracker()
	if gvr.Group == "argoproj.io" {
		tracker = m.apps.Tracker()
	}
	obj, err := tracker.Get(gvr, ns, name)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return answer(r, http.StatusNotFound, apierrors.NewNotFound(gvr.GroupResource(), name).Status())
		}
		return answer(r, http.StatusInternalServerError, apierrors.NewInternalError(err).Status())
	}
	obj = obj.DeepCopyObject()
	obj.GetObjectKind().SetGroupVersionKind(gvr.GroupVersion().WithKind(kind))
	return answer(r, http.StatusOK, obj)
}

func answer(r *http.Request, code int, body any) (*http.Response, error) {
	if s, ok := body.(metav1.Status); ok {
		s.Kind, s.APIVersion = "Status", "v1"
		body = s
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return &http.Response{
		StatusCode: code,
		Header:     http.Header{"Content-Type": []string{"application/json"}},
		Body:       io.NopCloser(bytes.NewReader(b)),
		Request:    r,
	}, nil
}

// The resourceVersion given to the last object written, in any cluster.
var resourceVersion atomic.Int64

// versioned gives every object written a new resourceVersion, and every
// object created a uid and a creation time, as an API server does
// (client-go's object tracker leaves them empty; the agent tells its own
// writes from others' by the resourceVersion, and an object by its uid).
type versioned struct{ k8stesting.ObjectTracker }

func stamp(obj runtime.Object) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetResourceVersion(strconv.FormatInt(resourceVersion.Add(1), 10))
	}
}

func (v versioned) Create(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.CreateOptions) error {
	stamp(obj)
	if m, err := meta.Accessor(obj); err == nil {
		if m.GetUID() == "" {
			m.SetUID(uuid.NewUUID())
		}
		m.SetCreationTimestamp(metav1.Now())
	}
	return v.ObjectTracker.Create(gvr, obj, ns, opts...)
}

func (v versioned) Update(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.UpdateOptions) error {
	stamp(obj)
	return v.ObjectTracker.Update(gvr, obj, ns, opts...)
}

func (v versioned) Patch(gvr schema.GroupVersionResource, obj runtime.Object, ns string, opts ...metav1.PatchOptions) error {
	stamp(obj)
	return v.ObjectTracker.Patch(gvr, obj, ns, opts...)
}

// versions makes the clientset `f` write through [versioned], and gives
// its watches unbounded buffers: the object tracker's own watchers hold
// DefaultChanSize events and panic when a slow reader lets them fill, where
// an API server's watch would just be read later (the relay reads them at
// once, when it is scheduled: `main` raises DefaultChanSize for the time
// it is not).
func versions(f *k8stesting.Fake, t k8stesting.ObjectTracker) {
	f.PrependReactor("*", "*", k8stesting.ObjectReaction(versioned{t}))
	f.PrependWatchReactor("*", func(action k8stesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if w, ok := action.(k8stesting.WatchActionImpl); ok {
			opts = w.ListOptions
		}
		w, err := t.Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		return true, unbounded(w), nil
	})
}

// relay passes a watch's events on through a queue without bound, reading
// its source at once.
type relay struct {
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func unbounded(in watch.Interface) watch.Interface {
	r := &relay{out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(r.out)
		defer in.Stop()
		source := in.ResultChan()
		var queue []watch.Event
		for source != nil || len(queue) > 0 {
			var out chan watch.Event
			var next watch.Event
			if len(queue) > 0 {
				out, next = r.out, queue[0]
			}
			select {
			case e, ok := <-source:
				if !ok {
					source = nil
					continue
				}
				queue = append(queue, e)
			case out <- next:
				queue = queue[1:]
			case <-r.stop:
				return
			}
		}
	}()
	return r
}

func (r *relay) ResultChan() <-chan watch.Event { return r.out }

func (r *relay) Stop() { r.once.Do(func() { close(r.stop) }) }
