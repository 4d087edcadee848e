package app

import (
	"io"
	"os"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/imshard/imshard/config"
)

// NewLogger builds the process logger: JSON, or human-readable console
// output when log.format is console, or auto and w is a terminal. Its level is
// the process-wide one (SetLogLevel), so a reload changes it for every logger
// derived from it.
func NewLogger(c config.Log, w io.Writer) zerolog.Logger {
	SetLogLevel(c.Level)
	console := c.Format == "console"
	if c.Format == "auto" || c.Format == "" {
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			console = true
		}
	}
	if console {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	return zerolog.New(w).With().Timestamp().Logger()
}

// SetLogLevel sets the level of every logger of the process (log.level; an
// unknown level means info, which Validate prevents).
func SetLogLevel(level string) {
	l, err := zerolog.ParseLevel(level)
	if err != nil {
		l = zerolog.InfoLevel
	}
	zerolog.SetGlobalLevel(l)
}
