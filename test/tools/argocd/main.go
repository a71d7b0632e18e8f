// Command argocd is one multi-call binary holding the Argo CD components
// the test harness runs as processes: the application-controller and
// repo-server of each managed cluster, and the hub's
// applicationset-controller. Each is upstream's own cobra command, built
// from the pinned github.com/argoproj/argo-cd/v3 module; this file only
// picks one, so that the API server, UI, CLI and Dex stay out of the build.
//
// The component is chosen like upstream's cmd/main.go chooses it: by
// $ARGOCD_BINARY_NAME, else by the name the binary runs as (a symlink), else
// by the first argument (`argocd argocd-repo-server --port=...`). The
// repo-server runs git with GIT_ASKPASS=argocd and
// ARGOCD_BINARY_NAME=argocd-git-ask-pass, so this binary, found on PATH as
// `argocd`, must answer as the askpass helper too.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	applicationset "github.com/argoproj/argo-cd/v3/cmd/argocd-applicationset-controller/commands"
	gitaskpass "github.com/argoproj/argo-cd/v3/cmd/argocd-git-ask-pass/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/util/log"
)

var commands = map[string]func() *cobra.Command{
	common.CommandApplicationController:    appcontroller.NewCommand,
	common.CommandRepoServer:               reposerver.NewCommand,
	common.CommandApplicationSetController: applicationset.NewCommand,
	common.CommandGitAskPass:               gitaskpass.NewCommand,
}

func init() {
	// As upstream's main: klog through the configured logrus logger.
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
}

func main() {
	// Upstream's main calls grpc.DisableSRVLookups() here, which panics
	// unless gRPC's SRV lookups are on; only the grpclb balancer turns them
	// on, and none of these components links it, so they are off already.
	name := os.Getenv("ARGOCD_BINARY_NAME")
	if name == "" {
		name = filepath.Base(os.Args[0])
	}
	args := os.Args[1:]
	newCommand, ok := commands[name]
	if !ok && len(args) > 0 {
		newCommand, ok = commands[args[0]]
		args = args[1:]
	}
	if !ok {
		fmt.Fprintf(os.Stderr, "usage: argocd {%s|%s|%s|%s} [flags]\n",
			common.CommandApplicationController, common.CommandRepoServer,
			common.CommandApplicationSetController, common.CommandGitAskPass)
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(args)
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
