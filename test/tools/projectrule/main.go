// Command projectrule answers, with Argo CD's own code, whether an
// AppProject allows an Application: the oracle of argocd-pull's project
// rule test (test/tests/project_rule.rs), which runs argocd-pull's
// `core::route::project` on the same cases and fails on any disagreement.
//
// It reads a JSON array of queries on stdin and writes a JSON array of
// answers, one per query, in order. Each query is one Argo CD instance's
// view: the project, the Application (its namespace and spec), the
// namespace Argo CD runs in, and the clusters it knows besides its own
// in-cluster. The answer is what argocd-server decides before it accepts
// an Application, in its order: `argo.GetAppProject` (the project, and
// `AppProject.IsAppNamespacePermitted`), then `argo.ValidatePermissions`
// (source repositories with `IsSourcePermitted`, the destination resolved
// by `argo.GetDestinationCluster`, then `IsDestinationPermitted`), with
// Argo CD's real settings and cluster database over a fake clientset
// holding its settings and the clusters' Secrets. Nothing of Argo CD's
// rule is written here.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	log "github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/pkg/apis/application/v1alpha1"
	listers "github.com/argoproj/argo-cd/v3/pkg/client/listers/application/v1alpha1"
	"github.com/argoproj/argo-cd/v3/util/argo"
	"github.com/argoproj/argo-cd/v3/util/db"
	"github.com/argoproj/argo-cd/v3/util/settings"
)

type cluster struct {
	Name   string `json:"name"`
	Server string `json:"server"`
}

type query struct {
	ID      string `json:"id"`
	Project struct {
		Name string                  `json:"name"`
		Spec v1alpha1.AppProjectSpec `json:"spec"`
	} `json:"project"`
	Application struct {
		Name      string                   `json:"name"`
		Namespace string                   `json:"namespace"`
		Spec      v1alpha1.ApplicationSpec `json:"spec"`
	} `json:"application"`
	// ControlPlane is the namespace Argo CD runs in: an Application there
	// may use any project.
	ControlPlane string `json:"controlPlane"`
	// Clusters are the cluster Secrets Argo CD has; its in-cluster
	// (https://kubernetes.default.svc) is always known as Argo CD ships it.
	Clusters []cluster `json:"clusters"`
}

type answer struct {
	ID      string `json:"id"`
	Allowed bool   `json:"allowed"`
	Message string `json:"message,omitempty"`
}

func main() {
	// Argo CD's informers log each start and stop; only its warnings say
	// something about an answer.
	log.SetLevel(log.WarnLevel)
	var queries []query
	if err := json.NewDecoder(os.Stdin).Decode(&queries); err != nil {
		fmt.Fprintf(os.Stderr, "projectrule: reading the queries on stdin: %v\n", err)
		os.Exit(2)
	}
	answers := make([]answer, 0, len(queries))
	for _, q := range queries {
		a, err := decide(q)
		if err != nil {
			fmt.Fprintf(os.Stderr, "projectrule: query %s: %v\n", q.ID, err)
			os.Exit(1)
		}
		answers = append(answers, a)
	}
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(answers); err != nil {
		fmt.Fprintf(os.Stderr, "projectrule: %v\n", err)
		os.Exit(1)
	}
}

// decide is the check argocd-server makes before it accepts an
// Application: the project by `argo.GetAppProject` (which refuses a
// namespace the project does not admit), then `argo.ValidatePermissions`.
func decide(q query) (answer, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	app := &v1alpha1.Application{
		ObjectMeta: metav1.ObjectMeta{Name: q.Application.Name, Namespace: q.Application.Namespace},
		Spec:       q.Application.Spec,
	}
	projects := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	err := projects.Add(&v1alpha1.AppProject{
		ObjectMeta: metav1.ObjectMeta{Name: q.Project.Name, Namespace: q.ControlPlane},
		Spec:       q.Project.Spec,
	})
	if err != nil {
		return answer{}, err
	}
	settingsMgr, argoDB := clusterDB(ctx, q.ControlPlane, q.Clusters)
	proj, err := argo.GetAppProject(ctx, app, listers.NewAppProjectLister(projects), q.ControlPlane, settingsMgr, argoDB)
	if err != nil {
		return answer{ID: q.ID, Message: err.Error()}, nil
	}
	conditions, err := argo.ValidatePermissions(ctx, &app.Spec, proj, argoDB)
	if err != nil {
		return answer{}, err
	}
	if len(conditions) > 0 {
		return answer{ID: q.ID, Message: conditions[0].Message}, nil
	}
	return answer{ID: q.ID, Allowed: true}, nil
}

// clusterDB is Argo CD's own settings and cluster database over a fake API
// server holding its settings in namespace ns and one cluster Secret per
// cluster.
func clusterDB(ctx context.Context, ns string, clusters []cluster) (*settings.SettingsManager, db.ArgoDB) {
	partOf := map[string]string{"app.kubernetes.io/part-of": "argocd"}
	objects := []runtime.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name: common.ArgoCDConfigMapName, Namespace: ns, Labels: partOf,
		}},
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: common.ArgoCDSecretName, Namespace: ns, Labels: partOf},
			Data:       map[string][]byte{"server.secretkey": []byte("oracle")},
		},
	}
	for i, c := range clusters {
		objects = append(objects, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name:      fmt.Sprintf("cluster-%d", i),
				Namespace: ns,
				Labels:    map[string]string{common.LabelKeySecretType: common.LabelValueSecretTypeCluster},
			},
			Data: map[string][]byte{
				"name":   []byte(c.Name),
				"server": []byte(c.Server),
				"config": []byte("{}"),
			},
		})
	}
	client := fake.NewClientset(objects...)
	settingsMgr := settings.NewSettingsManager(ctx, client, ns)
	return settingsMgr, db.NewDB(ns, settingsMgr, client)
}
