package bench

import (
	"testing"

	"github.com/imshard/imshard/modules/move"
)

// TestMoveMarksAreTheMoversNames: the step and part names Move times the
// move by are the ones the mover reaches (its steps and StepHook's parts),
// which `tenant move` prints and the bench reads back; a renamed step
// would leave its mark unset and its figure wrong, not failing.
func TestMoveMarksAreTheMoversNames(t *testing.T) {
	for mark, name := range map[string]string{
		markCopy:     move.StepCopy,
		markProving:  move.HookProving,
		markProven:   move.HookProven,
		markCopied:   move.HookCopied,
		markCatchUp:  move.StepCatchUp,
		markVerify:   move.StepVerify,
		markVerified: move.HookVerified,
		markFenced:   move.HookFenced,
		markSynced:   move.HookSynced,
	} {
		if mark != name {
			t.Errorf("bench marks %q where the mover reaches %q", mark, name)
		}
	}
}
