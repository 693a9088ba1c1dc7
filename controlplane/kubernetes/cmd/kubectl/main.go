// Command kubectl is the upstream kubectl, built from the k8s.io/kubectl module.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		os.Exit(1)
	}
}
