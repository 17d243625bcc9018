"""What every layer uses: `errors` (`UserError`, shown as one line, and `where` prefixes) and
`values` (value types for counts and rates)."""
