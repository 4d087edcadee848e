package query

import (
	"github.com/imshard/imshard/modules/message"
	"github.com/imshard/imshard/modules/testhook"
)

// dropFirst is the testhook.DropSeq breakage: a since page without its
// first message, once per process and only in a page of two or more (so
// the page still covers the seq it leaves out). Inert in a shipped build.
func dropFirst(page []message.Message) []message.Message {
	if len(page) < 2 || !testhook.Broken(testhook.DropSeq) {
		return page
	}
	return page[1:]
}
