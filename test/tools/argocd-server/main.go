// Command argocd-server is the hub's Argo CD API server and UI backend, and
// Argo CD's `argocd` CLI, in one multi-call binary built from the same
// pinned github.com/argoproj/argo-cd/v3 module as ../main.go. It is a
// separate binary so that the components every managed cluster runs stay as
// they were built (their stamp holds ../main.go), and so that the server's
// and the CLI's dependencies stay out of them.
//
// It answers as the server when it runs as `argocd-server` (or
// $ARGOCD_BINARY_NAME says so) and as the CLI under any other name, as
// upstream's cmd/main.go does; build.sh links it as $CACHE/bin/argocd-cli/argocd.
//
// The web UI: argocd-server serves index.html only from the embedded file
// system of the module's ui package (ui.Embedded, `dist/app`), which the
// module download leaves empty; --staticassets adds files but never the
// index. So build.sh copies the UI it built from the module's ui/ sources
// into dist/app here (git-ignored), this binary embeds it, and init puts it
// in ui.Embedded's place before the server reads it.
package main

import (
	"embed"
	"errors"
	"os"
	"os/exec"
	"path/filepath"

	"k8s.io/klog/v2"

	apiserver "github.com/argoproj/argo-cd/v3/cmd/argocd-server/commands"
	cli "github.com/argoproj/argo-cd/v3/cmd/argocd/commands"
	"github.com/argoproj/argo-cd/v3/common"
	"github.com/argoproj/argo-cd/v3/ui"
	"github.com/argoproj/argo-cd/v3/util/log"
)

//go:embed dist/app
var builtUI embed.FS

func init() {
	ui.Embedded = builtUI
	// As upstream's main: klog through the configured logrus logger.
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
}

func main() {
	name := os.Getenv("ARGOCD_BINARY_NAME")
	if name == "" {
		name = filepath.Base(os.Args[0])
	}
	if name == common.CommandServer {
		if err := apiserver.NewCommand().Execute(); err != nil {
			os.Exit(1)
		}
		return
	}
	// The CLI prints its own errors, and runs `argocd-<plugin>` binaries for
	// commands it does not know, as upstream's main does.
	command := cli.NewCommand()
	command.SilenceErrors = true
	command.SilenceUsage = true
	if err := command.Execute(); err != nil {
		msg, pluginErr := cli.NewDefaultPluginHandler().HandleCommandExecutionError(err, true, os.Args)
		if pluginErr != nil {
			os.Stdout.WriteString(msg)
			var exitErr *exec.ExitError
			if errors.As(pluginErr, &exitErr) {
				os.Exit(exitErr.ExitCode())
			}
			os.Exit(1)
		}
	}
}
