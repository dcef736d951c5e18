// Package flagvocab keeps pdserve's flag vocabulary: one meaning per flag
// name across the coordinator (and its subcommands), the prefill and
// decode workers and loadtest, in the style of TestLayering.
//
// Servers and Help build each command's flag set as its main does and list
// it through --help (nothing starts); Parse reads the listing. Check fails
// a name that carries two meanings: a former name (cliflags.AddRenamed) of
// one flag that is another flag's name, or another flag's former name, in
// another command; or several registrations with different usages and no
// entry in Meanings, the table kept beside it that says what a shared name
// means. Clashes lists the names that still carry two meanings, with why;
// it only shrinks. Unread finds flags bound to a field that nothing reads.
//
// TestFlagVocabulary here checks the coordinator and the workers;
// loadtest's TestFlagVocabulary adds its own commands and checks all
// four binaries together, stale table entries included.
package flagvocab
