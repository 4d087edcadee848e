package config

// MaxRetentionMonths is the longest retention a tenant or a group may ask
// for (a hundred years): anything longer is a typo for 0, keep forever.
const MaxRetentionMonths = 1200
