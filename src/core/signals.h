// Note [Stopping on a signal]: SIGINT (Ctrl-C) and SIGTERM (what schedulers send before preempting)
// ask a run to stop cleanly: the first one only sets a flag, which the training loop reads between
// steps (after the optimizer, so never mid-update, and never mid-checkpoint): it then writes a
// checkpoint, says so with the command that resumes, and exits 128 + the signal (130, 143). A second
// signal ends the process at once (the default action), for a run that must die now. Under mpirun
// the ranks agree on the flag every step (a max over ranks), so all stop after the same step and the
// checkpoint is consistent whichever ranks got the signal.
#pragma once

namespace fp {

// Installs the handlers for SIGINT and SIGTERM (idempotent).
void stop_signals_install();
// The first stop signal received (SIGINT or SIGTERM), or 0.
int stop_signal();
// "SIGINT", "SIGTERM", or "signal N".
const char* signal_name(int sig);

}  // namespace fp
