// Offline validation of deploy/: the Kubernetes manifests, the systemd units and their flag
// files, and the Slurm script must name only flags the binaries accept (their --helpfull), and
// ports, probes, services, volumes and secrets must agree with each other. Nothing is deployed:
// this catches a renamed flag or a mistyped port before an operator does.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "tests/test_support.h"

namespace dtrain::testing {
namespace deploy_config_test {

const std::string kDeploy = DTRAIN_SOURCE_DIR "/deploy";

// The flags a binary accepts, from its --help ("  --name  help (default: ...)").
std::set<std::string> FlagsOf(const std::string& binary) {
  static std::map<std::string, std::set<std::string>> cache;
  auto [it, inserted] = cache.try_emplace(binary);
  if (inserted) {
    const std::string help = RunShell(binary + " --help 2>&1").output;
    static const std::regex flag(R"(\n  --([a-z_0-9]+)  )");
    for (std::sregex_iterator m(help.begin(), help.end(), flag), end; m != end; ++m) {
      it->second.insert((*m)[1]);
    }
  }
  return it->second;
}

std::string BinaryPath(const std::string& name) {
  if (name == "dtrain-coordinator") return DTRAIN_COORDINATOR_BIN;
  if (name == "dtrain-worker") return DTRAIN_WORKER_BIN;
  if (name == "dtrain") return DTRAIN_CLI_BIN;
  return "";
}

// "--state-dir=x" -> "state_dir"; "" for a non-flag.
std::string FlagName(const std::string& arg) {
  if (!absl::StartsWith(arg, "--")) return "";
  std::string name =
      arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
  return absl::StrReplaceAll(name, {{"-", "_"}});
}

void ExpectAccepted(const std::string& binary_name, const std::vector<std::string>& args,
                    const std::string& where) {
  const std::string binary = BinaryPath(binary_name);
  ASSERT_FALSE(binary.empty()) << where << ": unknown binary " << binary_name;
  const std::set<std::string> flags = FlagsOf(binary);
  ASSERT_GT(flags.size(), 5u) << binary << " --help listed no flags";
  for (const std::string& arg : args) {
    const std::string name = FlagName(arg);
    if (name.empty()) continue;
    EXPECT_EQ(flags.count(name), 1u) << where << ": " << binary_name << " has no flag --" << name;
  }
}

std::string ValueOf(const std::vector<std::string>& args, const std::string& flag) {
  for (const std::string& arg : args) {
    if (FlagName(arg) == flag && arg.find('=') != std::string::npos)
      return arg.substr(arg.find('=') + 1);
  }
  return "";
}

std::string PortOf(const std::string& host_port) {
  return host_port.substr(host_port.rfind(':') + 1);
}

std::vector<YAML::Node> Documents(const std::string& file) {
  return YAML::LoadAllFromFile(kDeploy + "/kubernetes/" + file);
}

std::vector<std::string> Strings(const YAML::Node& list) {
  std::vector<std::string> out;
  for (const YAML::Node& n : list) out.push_back(n.as<std::string>());
  return out;
}

// Checks one workload's pod template; fills its container ports by name.
void CheckPodTemplate(const YAML::Node& workload, const std::string& where,
                      std::set<std::string>* secrets, std::map<std::string, int>* out) {
  std::map<std::string, int>& ports = *out;
  const YAML::Node spec = workload["spec"]["template"]["spec"];
  std::set<std::string> volumes;
  for (const YAML::Node& v : spec["volumes"]) {
    volumes.insert(v["name"].as<std::string>());
    if (v["secret"]) secrets->insert(v["secret"]["secretName"].as<std::string>());
  }
  for (const YAML::Node& c : spec["containers"]) {
    const std::string name = c["name"].as<std::string>();
    const std::vector<std::string> command = Strings(c["command"]);
    const std::vector<std::string> args = Strings(c["args"]);
    const std::string binary = std::filesystem::path(command.at(0)).filename();
    ExpectAccepted(binary, args, where + " container " + name);
    for (const YAML::Node& p : c["ports"])
      ports[p["name"].as<std::string>()] = p["containerPort"].as<int>();
    const std::string listen = ValueOf(args, "listen");
    ASSERT_FALSE(listen.empty()) << where << ": no --listen";
    EXPECT_EQ(ports.count("grpc"), 1u) << where;
    EXPECT_EQ(PortOf(listen), std::to_string(ports["grpc"]))
        << where << ": --listen vs containerPort";
    const std::string metrics = ValueOf(args, "metrics_listen");
    if (!metrics.empty()) {
      EXPECT_EQ(ports.count("metrics"), 1u) << where << ": --metrics_listen without a metrics port";
      EXPECT_EQ(PortOf(metrics), std::to_string(ports["metrics"])) << where;
      const YAML::Node annotations = workload["spec"]["template"]["metadata"]["annotations"];
      EXPECT_EQ(annotations["prometheus.io/port"].as<std::string>(), PortOf(metrics)) << where;
    }
    // The dashboard: its container port is the one it listens on, and it has the token (or it
    // would refuse to serve beyond loopback).
    const std::string http = ValueOf(args, "http_listen");
    if (!http.empty()) {
      EXPECT_EQ(ports.count("https"), 1u) << where << ": --http_listen without an https port";
      EXPECT_EQ(PortOf(http), std::to_string(ports["https"])) << where;
      EXPECT_FALSE(ValueOf(args, "token_file").empty()) << where << ": a dashboard without a token";
    }
    // Files named by flags sit under a mounted volume.
    std::vector<std::string> mounts;
    for (const YAML::Node& m : c["volumeMounts"]) {
      mounts.push_back(m["mountPath"].as<std::string>());
      EXPECT_EQ(volumes.count(m["name"].as<std::string>()), 1u)
          << where << ": mount of an undeclared volume";
    }
    for (const std::string flag :
         {"tls_cert", "tls_key", "tls_ca", "token_file", "state_dir", "cache_dir", "jobs_dir"}) {
      const std::string path = ValueOf(args, flag);
      if (path.empty()) continue;
      bool mounted = false;
      for (const std::string& m : mounts) mounted |= absl::StartsWith(path, m);
      EXPECT_TRUE(mounted) << where << ": --" << flag << "=" << path << " is on no volume";
    }
    // Probes: `dtrain health 127.0.0.1:<the container's port> [--service=S]`.
    for (const std::string probe : {"readinessProbe", "livenessProbe"}) {
      ASSERT_TRUE(c[probe]) << where << ": no " << probe;
      const std::vector<std::string> probe_command = Strings(c[probe]["exec"]["command"]);
      ASSERT_GE(probe_command.size(), 3u) << where;
      EXPECT_EQ(std::filesystem::path(probe_command[0]).filename(), "dtrain") << where;
      EXPECT_EQ(probe_command[1], "health") << where;
      EXPECT_EQ(PortOf(probe_command[2]), std::to_string(ports["grpc"])) << where << " " << probe;
      ExpectAccepted("dtrain", probe_command, where + " " + probe);
      const std::string service = ValueOf(probe_command, "service");
      if (!service.empty()) {
        EXPECT_THAT(service,
                    ::testing::AnyOf("dtrain.v1.Coordinator", "dtrain.v1.Jobs", "dtrain.v1.Worker"))
            << where;
      }
    }
  }
}

TEST(DeployConfig, KubernetesManifests_FlagsPortsProbesVolumesAgree) {
  std::map<std::string, YAML::Node> by_kind_name;
  for (const std::string file : {"coordinator.yaml", "workers.yaml"}) {
    for (const YAML::Node& doc : Documents(file)) {
      by_kind_name[doc["kind"].as<std::string>() + "/" +
                   doc["metadata"]["name"].as<std::string>()] = doc;
    }
  }
  ASSERT_EQ(by_kind_name.count("Deployment/dtrain-coordinator"), 1u);
  ASSERT_EQ(by_kind_name.count("StatefulSet/dtrain-worker"), 1u);
  std::set<std::string> secrets;
  const YAML::Node coordinator = by_kind_name["Deployment/dtrain-coordinator"];
  const YAML::Node workers = by_kind_name["StatefulSet/dtrain-worker"];
  std::map<std::string, int> coordinator_ports, worker_ports;
  ASSERT_NO_FATAL_FAILURE(
      CheckPodTemplate(coordinator, "coordinator.yaml", &secrets, &coordinator_ports));
  ASSERT_NO_FATAL_FAILURE(CheckPodTemplate(workers, "workers.yaml", &secrets, &worker_ports));
  EXPECT_EQ(secrets, (std::set<std::string>{"dtrain-tls", "dtrain-token"}));
  EXPECT_EQ(coordinator["spec"]["replicas"].as<int>(), 1) << "one writer per job database";

  // Services select their pods and target their ports.
  const YAML::Node service = by_kind_name["Service/dtrain-coordinator"];
  const YAML::Node headless = by_kind_name["Service/dtrain-workers"];
  EXPECT_EQ(service["spec"]["selector"]["app"].as<std::string>(),
            coordinator["spec"]["template"]["metadata"]["labels"]["app"].as<std::string>());
  EXPECT_EQ(headless["spec"]["selector"]["app"].as<std::string>(),
            workers["spec"]["template"]["metadata"]["labels"]["app"].as<std::string>());
  EXPECT_EQ(service["spec"]["ports"][0]["targetPort"].as<int>(), coordinator_ports.at("grpc"));
  EXPECT_EQ(headless["spec"]["ports"][0]["targetPort"].as<int>(), worker_ports.at("grpc"));
  EXPECT_EQ(workers["spec"]["serviceName"].as<std::string>(), "dtrain-workers");

  // Workers reach the coordinator through its Service; each advertises its own stable name.
  const std::vector<std::string> worker_args =
      Strings(workers["spec"]["template"]["spec"]["containers"][0]["args"]);
  const std::vector<std::string> coordinator_args =
      Strings(coordinator["spec"]["template"]["spec"]["containers"][0]["args"]);
  const std::string service_address =
      absl::StrCat("dtrain-coordinator:", service["spec"]["ports"][0]["port"].as<int>());
  EXPECT_EQ(ValueOf(worker_args, "coordinator"), service_address);
  // No shared paths: the worker's cache and job files are on its pod's own volume (checked to
  // be mounted above), not the container's /tmp.
  EXPECT_FALSE(ValueOf(worker_args, "cache_dir").empty()) << "workers.yaml: no --cache_dir";
  EXPECT_FALSE(ValueOf(worker_args, "jobs_dir").empty()) << "workers.yaml: no --jobs_dir";
  EXPECT_EQ(ValueOf(coordinator_args, "advertise"), service_address);
  EXPECT_EQ(ValueOf(worker_args, "advertise"),
            absl::StrCat("$(POD_NAME).dtrain-workers:", worker_ports.at("grpc")));
  // A drained worker must be done before the kubelet's SIGKILL.
  absl::Duration drain;
  ASSERT_TRUE(absl::ParseDuration(ValueOf(worker_args, "drain_timeout"), &drain))
      << "workers.yaml: --drain_timeout missing or not a duration";
  // After the drain, a step that ignores its cancellation gets 30 s (WorkerService::kStopWait),
  // and the gRPC server's stop 5 s.
  EXPECT_LE(
      drain + absl::Seconds(35),
      absl::Seconds(workers["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as<int>()))
      << "workers.yaml: --drain_timeout must be 35 s below terminationGracePeriodSeconds";
  const YAML::Node claim = by_kind_name["PersistentVolumeClaim/dtrain-coordinator-state"];
  ASSERT_TRUE(claim.IsDefined());
  // A Guaranteed worker pod (integer CPU requests equal to limits, memory too): with the static
  // CPU manager policy its cores are its own, and --cpus=auto pins to them.
  const YAML::Node resources = workers["spec"]["template"]["spec"]["containers"][0]["resources"];
  const std::string cpu = resources["requests"]["cpu"].as<std::string>("");
  int whole = 0;
  EXPECT_TRUE(absl::SimpleAtoi(cpu, &whole) && whole > 0)
      << "workers.yaml: cpu request '" << cpu << "' is not a whole number of cores";
  EXPECT_EQ(resources["limits"]["cpu"].as<std::string>(""), cpu);
  EXPECT_EQ(resources["limits"]["memory"].as<std::string>(""),
            resources["requests"]["memory"].as<std::string>("-"));
  EXPECT_THAT(ValueOf(worker_args, "cpus"), ::testing::AnyOf("", "auto"))
      << "a core list in the manifest is not the container's cpuset";
}

TEST(DeployConfig, SystemdUnits_ExecStartAndFlagFilesAccepted) {
  for (const auto& [unit, binary] :
       std::map<std::string, std::string>{{"dtrain-coordinator.service", "dtrain-coordinator"},
                                          {"dtrain-worker.service", "dtrain-worker"}}) {
    const std::string text = ReadFile(kDeploy + "/systemd/" + unit);
    for (const std::string section : {"[Unit]", "[Service]", "[Install]"}) {
      EXPECT_THAT(text, ::testing::HasSubstr(section)) << unit;
    }
    std::smatch exec;
    ASSERT_TRUE(std::regex_search(text, exec,
                                  std::regex(R"(\nExecStart=(\S+) --flagfile=/etc/dtrain/(\S+))")))
        << unit;
    EXPECT_EQ(std::filesystem::path(exec[1].str()).filename(), binary) << unit;
    const std::string flags_file = kDeploy + "/systemd/" + exec[2].str();
    ASSERT_TRUE(std::filesystem::exists(flags_file)) << flags_file;
    std::vector<std::string> args;
    for (absl::string_view line : absl::StrSplit(ReadFile(flags_file), '\n', absl::SkipEmpty())) {
      args.emplace_back(absl::StripAsciiWhitespace(line));
      EXPECT_TRUE(absl::StartsWith(args.back(), "--")) << flags_file << ": " << args.back();
    }
    ExpectAccepted(binary, args, flags_file);
    EXPECT_FALSE(ValueOf(args, "listen").empty()) << flags_file;
  }
  // The worker's coordinator is where the coordinator listens and advertises.
  const std::string coordinator = ReadFile(kDeploy + "/systemd/coordinator.flags");
  const std::string worker = ReadFile(kDeploy + "/systemd/worker.flags");
  // No shared paths: the worker's files are in its own StateDirectory, which PrivateTmp and
  // ProtectHome leave writable (a default under /tmp would vanish with the unit's private tmp).
  for (const std::string flag : {"cache_dir", "jobs_dir"}) {
    EXPECT_THAT(worker, ::testing::HasSubstr("--" + flag + "=/var/lib/dtrain-worker/"))
        << "worker.flags: --" << flag;
  }
  EXPECT_THAT(ReadFile(kDeploy + "/systemd/dtrain-worker.service"),
              ::testing::HasSubstr("\nStateDirectory=dtrain-worker\n"));
  // SIGTERM to the daemon alone, and its drain done before systemd's SIGKILL.
  const std::string unit = ReadFile(kDeploy + "/systemd/dtrain-worker.service");
  EXPECT_THAT(unit, ::testing::HasSubstr("\nKillMode=mixed\n"));
  std::smatch stop, drain;
  ASSERT_TRUE(std::regex_search(unit, stop, std::regex(R"(\nTimeoutStopSec=(\S+))")));
  ASSERT_TRUE(std::regex_search(worker, drain, std::regex(R"(--drain_timeout=(\S+))")));
  absl::Duration stop_timeout, drain_timeout;
  ASSERT_TRUE(absl::ParseDuration(stop[1].str(), &stop_timeout));
  ASSERT_TRUE(absl::ParseDuration(drain[1].str(), &drain_timeout));
  EXPECT_LE(drain_timeout + absl::Seconds(35), stop_timeout)
      << "--drain_timeout must be 35 s below TimeoutStopSec (the stop's bound, the server's)";
  std::smatch advertise;
  ASSERT_TRUE(std::regex_search(coordinator, advertise, std::regex(R"(--advertise=(\S+))")));
  EXPECT_THAT(worker, ::testing::HasSubstr("--coordinator=" + advertise[1].str()));
}

TEST(DeployConfig, SlurmScript_ParsesAndItsCommandsUseRealFlags) {
  const std::string script = kDeploy + "/slurm/dtrain.sbatch";
  CommandResult syntax = RunShell("bash -n " + script + " 2>&1");
  EXPECT_EQ(syntax.exit_code, 0) << syntax.output;
  // Each logical line (continuations joined) that runs one of the binaries.
  const std::string joined = absl::StrReplaceAll(ReadFile(script), {{"\\\n", " "}});
  int commands = 0;
  for (absl::string_view line : absl::StrSplit(joined, '\n')) {
    if (absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "#")) continue;
    for (const std::string binary : {"dtrain-coordinator", "dtrain-worker", "client/dtrain"}) {
      const size_t at = line.find(binary + "\"");
      if (at == absl::string_view::npos) continue;
      std::vector<std::string> args;
      for (absl::string_view token : absl::StrSplit(line.substr(at), ' ', absl::SkipEmpty())) {
        args.emplace_back(token);
      }
      ExpectAccepted(binary == "client/dtrain" ? "dtrain" : binary, args, script);
      ++commands;
    }
  }
  EXPECT_GE(commands, 4) << "coordinator, worker, health wait and submit";
}

// The local launcher refuses a worker count or thread count it cannot use, by name, before it
// starts anything (--workers 0 once divided by zero in its thread split).
TEST(DeployConfig, LocalClusterScript_RefusesBadCountsByName) {
  const std::string script = kDeploy + "/local/cluster.sh";
  const std::string state = ::testing::TempDir() + "/cluster-flags";
  const std::string run = "DTRAIN_LOCAL_DIR=" + state + " bash " + script;
  for (const std::string bad : {"--workers 0", "--workers two", "--workers ''", "--threads -1"}) {
    CommandResult r = RunShell(run + " cpus " + bad + " 2>&1");
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.output;
    EXPECT_THAT(r.output, ::testing::HasSubstr(absl::StartsWith(bad, "--workers")
                                                   ? "--workers takes a whole number"
                                                   : "--threads takes a whole number"))
        << bad;
  }
  // A good count still prints one core list per worker (or nothing when they do not fit).
  CommandResult ok = RunShell(run + " cpus --workers 1 2>&1");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_FALSE(std::filesystem::exists(state + "/coordinator.pid")) << "nothing was started";
}

}  // namespace deploy_config_test
}  // namespace dtrain::testing
