package routing

import (
	"errors"

	"github.com/go-sql-driver/mysql"
)

// IsNoSuchTable reports whether err is the server's "table doesn't exist"
// (ER_NO_SUCH_TABLE, 1146): a month table registered but not there. Such a
// table holds no row, which a reader may take as an answer; a writer must
// wait for it.
func IsNoSuchTable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1146
}
