package readpath

import (
	"slices"

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

// gapOfStored is the testhook.GapOfStored breakage: the page's gaps with
// its first message's seq among them, once per process and only in a page
// holding a message. Inert in a shipped build.
func gapOfStored(gaps []int64, page []message.Message) []int64 {
	if len(page) == 0 || !testhook.Broken(testhook.GapOfStored) {
		return gaps
	}
	i, _ := slices.BinarySearch(gaps, page[0].Seq)
	return slices.Concat(gaps[:i], []int64{page[0].Seq}, gaps[i:])
}
