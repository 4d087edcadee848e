// Command imshard stores the group messages of a multi-tenant IM backend in
// monthly MySQL tables. See README.md and docs/.
package main

import (
	"os"

	"github.com/imshard/imshard/cmd"
)

func main() {
	os.Exit(cmd.Execute())
}
