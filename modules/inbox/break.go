package inbox

import "github.com/imshard/imshard/modules/testhook"

// plusOne is the testhook.UnreadPlusOne breakage: every non-zero unread
// count of an answer one higher than counted. Inert in a shipped build.
func plusOne(counts []unreadCount) []unreadCount {
	if !testhook.Broken(testhook.UnreadPlusOne) {
		return counts
	}
	for i := range counts {
		if counts[i].unread > 0 {
			counts[i].unread++
		}
	}
	return counts
}
