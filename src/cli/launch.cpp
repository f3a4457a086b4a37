// flatpeak launch: a supervisor of a multi-process training run (issue 51; docs/cluster.md, "The supervisor").
//
// Note [A supervisor]: `flatpeak launch --np W [--hostfile F] -- train ARGS` runs `mpirun -np W flatpeak
// train ARGS` and watches it. The ranks bound every step themselves (train.step_timeout, which launch sets:
// Note [A step that does not finish] in core/watchdog.h); launch bounds mpirun as well: when no step has
// finished (no new line in OUT/metrics.jsonl) for --hang-after seconds, it ends mpirun's process group
// (SIGTERM, SIGKILL 10 s later), since an mpirun whose daemon on a lost host cannot be told may never end.
// After a failure it takes the run's newest complete checkpoint (checkpoint_resume_point: Note [Resuming
// from the newest sound checkpoint] in train/checkpoint.h) and starts the run again with --resume, at most
// --max-restarts times; the steps after that checkpoint are redone, bit for bit as a resume by hand would.
// With a hostfile it first asks every host to run `true` through mpirun, which starts a daemon there the
// way the run's would (ssh, or the rsh agent) and needs it to call back, within --probe-timeout: a host
// that does not answer is gone. Without --elastic a host gone stops launch; with it the run goes on on the
// hosts that answer, with fewer data-parallel replicas, each reading more sequences, so the global batch
// (parallel.dp x train.batch_size) and the loss's normalisation stay what they were (a checkpoint loads on
// any layout; the resume check accepts the same dp x batch_size). Nothing is retried silently: every
// decision is a line of OUT/launch.jsonl and of launch's output, and an attempt that fails without getting
// past the previous failed attempt's last step, from the same checkpoint, stops launch with an error.
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "comm/comm.h"
#include "core/error.h"
#include "core/watchdog.h"
#include "train/checkpoint.h"
#include "train/run_config.h"

namespace fp::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct LaunchOptions {
  int64_t np = 0;
  std::string hostfile;
  int64_t max_restarts = 3;
  bool elastic = false;
  std::string mpirun = "mpirun";
  std::string mpirun_args;
  double step_timeout = 60;
  double hang_after = 0;  // 0: step_timeout + 30
  double probe_timeout = 20;
  std::vector<std::string> command;  // after --: train ARGS
  std::vector<std::string> unknown;  // what CLI11 did not recognise before --
};

// The supervisor's own SIGINT / SIGTERM: forwarded to mpirun, then no restart.
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_launch_signal(int sig) { g_signal = sig; }

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string quoted(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) {
    const bool plain = !a.empty() && a.find_first_of(" \t'\"$\\;&|<>*?()") == std::string::npos;
    s += (s.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return s;
}

// The decisions: a line of OUT/launch.jsonl each, and "[flatpeak launch] ..." on stdout.
class Decisions {
 public:
  explicit Decisions(const std::string& path) : path_(path) {}
  void say(const std::string& event, nlohmann::json fields, const std::string& text) {
    fields["time"] = now_utc();
    fields["event"] = event;
    fields["message"] = text;
    std::ofstream f(path_, std::ios::app);
    f << fields.dump() << "\n";
    std::printf("[flatpeak launch] %s\n", text.c_str());
    std::fflush(stdout);
  }

 private:
  std::string path_;
};

// The value of `flag` in a train command line ("--out X" or "--out=X"), or "".
std::string arg_value(const std::vector<std::string>& cmd, const std::string& flag) {
  std::string v;
  for (size_t i = 0; i < cmd.size(); ++i) {
    if (cmd[i] == flag && i + 1 < cmd.size()) v = cmd[i + 1];
    if (cmd[i].rfind(flag + "=", 0) == 0) v = cmd[i].substr(flag.size() + 1);
  }
  return v;
}
std::vector<std::string> arg_values(const std::vector<std::string>& cmd, const std::string& flag) {
  std::vector<std::string> v;
  for (size_t i = 0; i < cmd.size(); ++i) {
    if (cmd[i] == flag && i + 1 < cmd.size()) v.push_back(cmd[i + 1]);
    if (cmd[i].rfind(flag + "=", 0) == 0) v.push_back(cmd[i].substr(flag.size() + 1));
  }
  return v;
}
// cmd without `flag` (and its value when it takes one).
std::vector<std::string> arg_remove(const std::vector<std::string>& cmd, const std::string& flag, bool has_value) {
  std::vector<std::string> r;
  for (size_t i = 0; i < cmd.size(); ++i) {
    if (cmd[i] == flag) {
      if (has_value) ++i;
      continue;
    }
    if (has_value && cmd[i].rfind(flag + "=", 0) == 0) continue;
    r.push_back(cmd[i]);
  }
  return r;
}

struct Host {
  std::string name;
  int64_t slots = 0;  // 0: not given
};

std::vector<Host> hostfile_read(const std::string& path) {
  std::ifstream f(path);
  FP_CHECK(f.good(), "give a readable hostfile: one host a line, 'NAME slots=N'", "--hostfile '{}' cannot be read",
           path);
  std::vector<Host> hosts;
  std::string line;
  for (int n = 1; std::getline(f, line); ++n) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    Host h;
    if (!(words >> h.name)) continue;
    for (std::string w; words >> w;) {
      if (w.rfind("slots=", 0) != 0) continue;
      try {
        h.slots = std::stoll(w.substr(6));
      } catch (const std::exception&) {
        h.slots = -1;
      }
      FP_CHECK(h.slots > 0, "write slots=N with N >= 1", "{} line {}: '{}' is not a number of slots", path, n, w);
    }
    hosts.push_back(h);
  }
  FP_CHECK(!hosts.empty(), "one host a line, 'NAME slots=N'", "--hostfile '{}' names no host", path);
  return hosts;
}

// The step of the last line of metrics.jsonl (0: none).
int64_t metrics_last_step(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f.good()) return 0;
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 65536);
  f.seekg(from);
  std::string tail((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream lines(tail);
  int64_t step = 0;
  for (std::string l; std::getline(lines, l);) {
    try {
      const nlohmann::json j = nlohmann::json::parse(l);
      if (j.contains("step")) step = j["step"].get<int64_t>();
    } catch (const std::exception&) {  // the first, partial line of the tail, or a line being written
    }
  }
  return step;
}

uint64_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  const uint64_t n = fs::file_size(path, ec);
  return ec ? 0 : n;
}

// Starts argv in a process group of its own, stdout and stderr to `log` when given (else ours).
pid_t spawn(const std::vector<std::string>& argv, const std::string& log = "") {
  const pid_t pid = fork();
  FP_CHECK(pid >= 0, "", "fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    // No terminal input: a background process group reading it would be stopped (SIGTTIN).
    if (const int null = open("/dev/null", O_RDONLY); null >= 0) {
      dup2(null, 0);
      close(null);
    }
    if (!log.empty()) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
    }
    std::vector<char*> a;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    std::fprintf(stderr, "error: flatpeak launch: cannot run '%s': %s\n", a[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // as the child does: whichever runs first
  return pid;
}

// Ends process group pid: SIGTERM, then SIGKILL after grace seconds; reaps pid. Returns its wait status.
int group_end(pid_t pid, double grace) {
  kill(-pid, SIGTERM);
  const Clock::time_point t0 = Clock::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (seconds_since(t0) > grace) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill(-pid, SIGKILL);  // what mpirun left in its group
  return status;
}

std::vector<std::string> mpirun_base(const LaunchOptions& o) {
  std::vector<std::string> argv = {o.mpirun};
  std::istringstream words(o.mpirun_args);
  std::vector<std::string> extra;
  for (std::string w; words >> w;) extra.push_back(w);
  const bool has_root_flag = std::find(extra.begin(), extra.end(), "--allow-run-as-root") != extra.end();
  if (geteuid() == 0 && !has_root_flag) argv.push_back("--allow-run-as-root");
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// Which hosts answer (Note [A supervisor]): `mpirun --host NAME:1 -np 1 true` on each, all at once,
// within timeout seconds; its output in OUT/launch-probe-NAME.log.
std::vector<bool> hosts_probe(const LaunchOptions& o, const std::vector<Host>& hosts, const std::string& out) {
  std::vector<pid_t> pids;
  for (const Host& h : hosts) {
    std::vector<std::string> argv = mpirun_base(o);
    argv.insert(argv.end(), {"--host", h.name + ":1", "-np", "1", "true"});
    pids.push_back(spawn(argv, out + "/launch-probe-" + h.name + ".log"));
  }
  std::vector<bool> alive(hosts.size(), false), done(hosts.size(), false);
  const Clock::time_point t0 = Clock::now();
  for (size_t left = hosts.size(); left > 0 && seconds_since(t0) < o.probe_timeout;) {
    for (size_t i = 0; i < hosts.size(); ++i) {
      int status = 0;
      if (done[i] || waitpid(pids[i], &status, WNOHANG) == 0) continue;
      done[i] = true;
      alive[i] = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      --left;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (size_t i = 0; i < hosts.size(); ++i)
    if (!done[i]) group_end(pids[i], 2);
  return alive;
}

// The mesh keys of the run that the elastic restart changes (Note [A device mesh] in train/trainer.cpp).
struct Layout {
  int64_t W = 1, dp = 1, batch = 1, ep = 0, fsdp = 0;
  std::string describe() const {
    return fmt::format("{} ranks, parallel.dp = {}, train.batch_size = {}{}{}", W, dp, batch,
                       ep > 0 ? fmt::format(", parallel.ep = {}", ep) : "",
                       fsdp > 0 ? fmt::format(", parallel.fsdp = {}", fsdp) : "");
  }
};

// The layout `slots` ranks can hold (Note [A supervisor]): the most replicas d of the run's dp (d divides dp
// and d x the ranks of a replica fit), each reading dp x batch / d sequences.
Layout layout_shrink(const Layout& now, int64_t slots, const std::string& hosts_text) {
  const int64_t per_replica = now.W / now.dp;
  for (int64_t d = now.dp; d >= 1; --d) {
    if (now.dp % d != 0 || d * per_replica > slots || (now.dp * now.batch) % d != 0) continue;
    Layout l = now;
    l.W = d * per_replica;
    l.dp = d;
    l.batch = now.dp * now.batch / d;
    for (int64_t* k : {&l.ep, &l.fsdp}) {
      if (*k == 0 || l.W % *k == 0) continue;
      FP_CHECK(*k == now.W, "give parallel.ep and parallel.fsdp within a replica (dividing W / dp), or 0",
               "cannot continue on {}: {} = {} neither divides the {} ranks left nor spans all ranks", hosts_text,
               k == &l.ep ? "parallel.ep" : "parallel.fsdp", *k, l.W);
      *k = 0;  // all ranks, as before
    }
    return l;
  }
  throw Error(fmt::format("cannot continue on {}: they hold {} ranks, and a replica of the run ({}) needs {}",
                          hosts_text, slots, now.describe(), per_replica),
              "add hosts, or restart by hand on a layout they hold (a checkpoint loads on any layout)");
}

struct Attempt {
  int status = 0;     // waitpid's
  bool hung = false;  // launch ended it: no step finished for --hang-after seconds
  int forwarded = 0;  // a signal launch received and passed on
  double seconds = 0;
};

Attempt attempt_run(const std::vector<std::string>& argv, const std::string& metrics, double hang_after,
                    Decisions& log) {
  Attempt a;
  const Clock::time_point t0 = Clock::now();
  const pid_t pid = spawn(argv);
  Clock::time_point progress = t0;
  uint64_t size = file_size_or_zero(metrics);
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      a.status = status;
      break;
    }
    if (g_signal != 0 && a.forwarded == 0) {
      a.forwarded = g_signal;
      kill(pid, a.forwarded);  // mpirun passes it to every rank: they checkpoint and stop (Note [Stopping on a signal])
      log.say("signal", {{"signal", a.forwarded}},
              fmt::format("got signal {}: passed to mpirun; the run stops with a checkpoint, no restart", a.forwarded));
      progress = Clock::now();
    }
    const uint64_t s = file_size_or_zero(metrics);
    if (s != size) {
      size = s;
      progress = Clock::now();
    }
    if (seconds_since(progress) > hang_after) {
      a.hung = true;
      log.say("hung", {{"seconds", hang_after}},
              fmt::format("no step finished for {:.0f} s (--hang-after): ending mpirun (SIGTERM, then SIGKILL after "
                          "10 s)",
                          hang_after));
      a.status = group_end(pid, 10);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  kill(-pid, SIGKILL);  // anything of the attempt left in mpirun's group on this host
  a.seconds = seconds_since(t0);
  return a;
}

std::string status_text(const Attempt& a) {
  std::string s;
  if (WIFEXITED(a.status))
    s = fmt::format("mpirun exit {}", WEXITSTATUS(a.status));
  else if (WIFSIGNALED(a.status))
    s = fmt::format("mpirun killed by signal {}", WTERMSIG(a.status));
  if (a.hung) s += ", ended by launch: no step finished in time";
  if (WIFEXITED(a.status) && WEXITSTATUS(a.status) == kWatchdogExit)
    s += ", a step timed out (train.step_timeout; the ranks' errors above name it)";
  return s;
}

int launch_run(const LaunchOptions& o0) {
  LaunchOptions o = o0;
  FP_CHECK(comm_world().size() == 1, "run flatpeak launch itself once; it starts mpirun",
           "flatpeak launch was started by mpirun on {} ranks", comm_world().size());
  FP_CHECK(o.unknown.empty(), "run 'flatpeak launch --help' for its options; the run follows '--'",
           "flatpeak launch has no option '{}'", o.unknown.empty() ? "" : o.unknown[0]);
  FP_CHECK(!o.command.empty() && o.command[0] == "train",
           "write the run after '--': flatpeak launch --np 4 -- train --config run.toml --out DIR",
           "flatpeak launch supervises 'train' runs; got '{}'", o.command.empty() ? "" : o.command[0]);
  std::vector<std::string> cmd = o.command;
  const std::string out = arg_value(cmd, "--out");
  FP_CHECK(!out.empty(), "give the run's --out DIR (its checkpoints are where launch restarts from)",
           "the train command has no --out");
  FP_CHECK(arg_value(cmd, "--stop-after").empty(), "leave --stop-after out: launch runs to the end",
           "flatpeak launch does not take train's --stop-after (each restart would stop after it again)");
  {
    std::istringstream words(o.mpirun_args);
    for (std::string w; words >> w;)
      FP_CHECK(w != "-np" && w != "-n" && w != "--np" && w != "--hostfile" && w != "-hostfile" && w != "--host" &&
                   w != "-H" && w != "--machinefile",
               "give the ranks and hosts as launch's own --np and --hostfile (a restart changes them)",
               "--mpirun-args holds '{}'", w);
  }
  FP_CHECK(!o.elastic || !o.hostfile.empty(), "give --hostfile F with every host's slots",
           "--elastic needs --hostfile: it restarts on the hosts of the hostfile that answer");
  std::vector<Host> hosts;
  if (!o.hostfile.empty()) hosts = hostfile_read(o.hostfile);
  if (o.elastic)
    for (const Host& h : hosts)
      FP_CHECK(h.slots > 0, "write 'NAME slots=N' for every host",
               "--elastic needs every host's slots in the hostfile; {} has none", h.name);

  // The step bound the ranks keep (Note [A step that does not finish]): --step-timeout unless the command
  // sets train.step_timeout itself.
  std::vector<std::string> sets = arg_values(cmd, "--set");
  double step_timeout = o.step_timeout;
  bool set_by_command = false;
  for (const std::string& s : sets)
    if (s.rfind("train.step_timeout=", 0) == 0) {
      try {
        step_timeout = std::stod(s.substr(19));
      } catch (const std::exception&) {
        step_timeout = -1;
      }
      set_by_command = true;
    }
  if (!set_by_command) {
    cmd.insert(cmd.end(), {"--set", fmt::format("train.step_timeout={}", o.step_timeout)});
    sets.push_back(fmt::format("train.step_timeout={}", o.step_timeout));
  }
  FP_CHECK(step_timeout > 0, "give the ranks a step bound: --step-timeout S",
           "train.step_timeout = {}: launch needs "
           "a bound on every step to notice a frozen host",
           step_timeout);
  const double hang_after = o.hang_after > 0 ? o.hang_after : step_timeout + 30;

  // The layout, for --elastic (the config as train reads it, with the command's --set items).
  Layout layout;
  layout.W = o.np;
  if (o.elastic) {
    const std::string config = arg_value(cmd, "--config");
    FP_CHECK(!config.empty(), "give train --config", "--elastic reads the run's layout from train's --config");
    const RunConfig cfg = config_load(config, sets);
    layout.dp = cfg.parallel.dp;
    layout.batch = cfg.train.batch_size;
    layout.ep = cfg.parallel.ep;
    layout.fsdp = cfg.parallel.fsdp;
  }

  // A folder that holds another run, not named by --resume or --overwrite: train refuses it, and launch must not
  // then "restart" that other run from its checkpoint.
  const bool foreign = (fs::exists(out + "/metrics.jsonl") || fs::exists(out + "/checkpoint")) &&
                       arg_value(cmd, "--resume").empty() &&
                       std::find(cmd.begin(), cmd.end(), "--overwrite") == cmd.end();
  fs::create_directories(out);
  Decisions log(out + "/launch.jsonl");
  struct sigaction sa {};
  sa.sa_handler = on_launch_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const std::string self = fs::read_symlink("/proc/self/exe").string();

  std::string hostfile = o.hostfile;
  int64_t restarts = 0, redone = 0, fail_step = -1, fail_ckpt = -1;
  const Clock::time_point t_run = Clock::now();
  for (int64_t attempt = 1;; ++attempt) {
    if (g_signal != 0) {  // between two attempts: nothing to pass on, nothing restarted
      log.say("stopped", {{"attempt", attempt}, {"signal", int(g_signal)}},
              fmt::format("got signal {} before attempt {}: not restarting", int(g_signal), attempt));
      return 128 + g_signal;
    }
    std::vector<std::string> argv = mpirun_base(o);
    if (!hostfile.empty()) argv.insert(argv.end(), {"--hostfile", hostfile});
    argv.insert(argv.end(), {"-np", std::to_string(layout.W), self});
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    log.say("start", {{"attempt", attempt}, {"argv", argv}},
            fmt::format("attempt {}: {} (step bound {} s, launch ends mpirun after {} s without a step)", attempt,
                        quoted(argv), step_timeout, hang_after));
    const Attempt a = attempt_run(argv, out + "/metrics.jsonl", hang_after, log);
    const int64_t last = metrics_last_step(out + "/metrics.jsonl");
    if (a.forwarded != 0) {
      log.say(
          "stopped", {{"attempt", attempt}, {"signal", a.forwarded}, {"status", status_text(a)}},
          fmt::format("stopped by signal {} after step {} ({}); not restarting", a.forwarded, last, status_text(a)));
      return WIFEXITED(a.status) ? WEXITSTATUS(a.status) : 128 + a.forwarded;
    }
    if (!a.hung && WIFEXITED(a.status) && WEXITSTATUS(a.status) == 0) {
      log.say(
          "finished",
          {{"attempt", attempt},
           {"restarts", restarts},
           {"steps_redone", redone},
           {"last_step", last},
           {"seconds", seconds_since(t_run)}},
          fmt::format("finished at step {} after {} restart{}: {} step{} redone (done before a failure and "
                      "after the checkpoint resumed), {:.1f} s in all",
                      last, restarts, restarts == 1 ? "" : "s", redone, redone == 1 ? "" : "s", seconds_since(t_run)));
      return 0;
    }
    // A failure: where the run can continue from.
    std::string ckpt;
    int64_t ckpt_step = 0;
    try {
      const ResumePoint rp = checkpoint_resume_point(out);
      ckpt = rp.dir;
      std::ifstream st(rp.dir + "/trainer_state.json");
      ckpt_step = nlohmann::json::parse(st).at("step").get<int64_t>();
    } catch (const std::exception&) {
      ckpt.clear();  // none complete: from the start
    }
    log.say("failed",
            {{"attempt", attempt},
             {"status", status_text(a)},
             {"last_step", last},
             {"checkpoint", ckpt},
             {"checkpoint_step", ckpt_step},
             {"seconds", a.seconds}},
            fmt::format("attempt {} failed after step {} ({}, {:.1f} s); newest complete checkpoint: {}", attempt, last,
                        status_text(a), a.seconds,
                        ckpt.empty() ? std::string("none") : fmt::format("{} (step {})", ckpt, ckpt_step)));
    const std::string by_hand = fmt::format("resume by hand: flatpeak launch ... -- train ... --resume {}", out);
    if (attempt == 1 && foreign) {
      log.say("give_up", {{"attempt", attempt}},
              fmt::format("{} held an earlier run before this launch, and the train command neither resumes nor "
                          "overwrites it: not restarting",
                          out));
      throw Error(
          fmt::format("the run failed at its start ({}), and --out '{}' holds an earlier run", status_text(a), out),
          fmt::format("read train's error above; add --resume {} or --overwrite to the train command", out));
    }
    if (restarts >= o.max_restarts) {
      log.say("give_up", {{"attempt", attempt}, {"restarts", restarts}},
              fmt::format("--max-restarts {} reached: not restarting", o.max_restarts));
      throw Error(fmt::format("the run failed {} times ({} restarts, --max-restarts {}); the last: {}", attempt,
                              restarts, o.max_restarts, status_text(a)),
                  by_hand);
    }
    if (last <= fail_step && ckpt_step == fail_ckpt) {
      log.say("give_up", {{"attempt", attempt}, {"last_step", last}},
              fmt::format("attempt {} failed at step {} from the checkpoint of step {}, as the attempt before it did: "
                          "no progress, not restarting",
                          attempt, last + 1, ckpt_step));
      throw Error(fmt::format("the run fails again at step {} with no progress since the checkpoint of step {} ({})",
                              last + 1, ckpt_step, status_text(a)),
                  "read the ranks' errors above; " + by_hand + " once the cause is fixed");
    }
    fail_step = last;
    fail_ckpt = ckpt_step;

    // The hosts (Note [A supervisor]).
    if (!hosts.empty()) {
      const Clock::time_point t0 = Clock::now();
      const std::vector<bool> alive = hosts_probe(o, hosts, out);
      std::vector<Host> left;
      std::string gone, kept;
      int64_t slots = 0;
      for (size_t i = 0; i < hosts.size(); ++i) {
        std::string& list = alive[i] ? kept : gone;
        list += (list.empty() ? "" : ", ") + hosts[i].name;
        if (alive[i]) {
          left.push_back(hosts[i]);
          slots += hosts[i].slots;
        }
      }
      log.say("probe", {{"alive", kept}, {"gone", gone}, {"seconds", seconds_since(t0)}},
              fmt::format("hosts that answer within {} s: {}{}", o.probe_timeout, kept.empty() ? "none" : kept,
                          gone.empty() ? std::string() : "; gone: " + gone));
      if (!gone.empty()) {
        if (!o.elastic) {
          log.say("give_up", {{"gone", gone}}, fmt::format("host {} gone and no --elastic: not restarting", gone));
          throw Error(
              fmt::format("host {} does not answer (probe within {} s); the run cannot restart on all its hosts", gone,
                          o.probe_timeout),
              "pass --elastic to go on on the others, or " + by_hand + " once the host is back");
        }
        FP_CHECK(!left.empty(), by_hand, "no host of {} answers", o.hostfile);
        const Layout next = layout_shrink(layout, slots, kept);
        hostfile = out + "/launch-hostfile";
        std::ofstream hf(hostfile);
        for (const Host& h : left) hf << h.name << " slots=" << h.slots << "\n";
        hf.close();
        hosts = left;
        log.say("layout", {{"from", layout.describe()}, {"to", next.describe()}, {"hostfile", hostfile}},
                fmt::format("elastic: continuing on {} ({}) with {} (was {}); the global batch stays {} sequences",
                            kept, hostfile, next.describe(), layout.describe(), next.dp * next.batch));
        layout = next;
        for (const auto& [key, v] : {std::pair<const char*, int64_t>{"parallel.dp", layout.dp},
                                     {"train.batch_size", layout.batch},
                                     {"parallel.ep", layout.ep},
                                     {"parallel.fsdp", layout.fsdp}})
          cmd.insert(cmd.end(), {"--set", fmt::format("{}={}", key, v)});
      }
    }

    // The restart: from the checkpoint, or from the start when there is none.
    cmd = arg_remove(arg_remove(cmd, "--resume", true), "--overwrite", false);
    if (!ckpt.empty()) {
      cmd = arg_remove(cmd, "--init-from", true);  // the checkpoint holds the weights now
      cmd.insert(cmd.end(), {"--resume", out});
    } else {
      cmd.push_back("--overwrite");  // from the start again (--init-from, if given, as before)
    }
    const int64_t lost = std::max<int64_t>(0, last - ckpt_step);
    redone += lost;
    ++restarts;
    log.say("restart",
            {{"restart", restarts}, {"checkpoint", ckpt}, {"checkpoint_step", ckpt_step}, {"steps_redone", lost}},
            fmt::format("restart {} of at most {}: from {}, redoing {} step{}", restarts, o.max_restarts,
                        ckpt.empty() ? std::string("the start (no complete checkpoint)")
                                     : fmt::format("the checkpoint of step {}", ckpt_step),
                        lost, lost == 1 ? "" : "s"));
  }
}

}  // namespace

void launch_register(CLI::App& app, Runner& run) {
  auto opts = std::make_shared<LaunchOptions>();
  LaunchOptions& o = *opts;
  CLI::App* sub = app.add_subcommand(
      "launch", "run mpirun ... flatpeak train and restart it from its newest checkpoint after a failure");
  // An option launch does not know is kept by CLI11 (allow_extras) and refused by name in launch_run, rather than
  // taken for part of the run.
  sub->allow_extras();
  sub->positionals_at_end();
  sub->callback([&run, opts, sub] {
    for (const std::string& w : sub->remaining())
      if (w != "--") opts->unknown.push_back(w);
    run = [opts] { return launch_run(*opts); };
  });
  sub->add_option("--np", o.np, "ranks (mpirun -np)")->required()->check(at_least(1));
  sub->add_option("--hostfile", o.hostfile, "Open MPI hostfile, 'NAME slots=N' a line (probed after a failure)");
  sub->add_option("--max-restarts", o.max_restarts, "restarts after failures before giving up (default 3)")
      ->check(at_least(0));
  sub->add_flag("--elastic", o.elastic,
                "after a host is lost, go on on the hosts that answer with fewer data-parallel replicas (same "
                "global batch)");
  sub->add_option("--mpirun", o.mpirun, "the mpirun to run (default: mpirun on PATH)");
  sub->add_option("--mpirun-args", o.mpirun_args, "more mpirun arguments, one string: \"--map-by node -x VAR\"");
  sub->add_option("--step-timeout", o.step_timeout,
                  "seconds a step may take before its ranks end (train.step_timeout; default 60)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--hang-after", o.hang_after,
                  "end mpirun when no step finished for this many seconds (default: step timeout + 30)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--probe-timeout", o.probe_timeout, "seconds a host has to answer the probe (default 20)")
      ->check(CLI::PositiveNumber);
  sub->add_option("command", o.command, "after --: the run, train --config ... --out DIR ...");
}

}  // namespace fp::cli
