#include "worker/data/shard_catalog.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_reference.h"
#include "common/sha256.h"
#include "common/shard_list.h"
#include "common/status_macros.h"
#include "common/tar_sample_count.h"

namespace dtrain {
namespace {

// `location` as the list file at `list` means it: absolute locations (a URL, a mark, a path
// starting with '/') as they are; others relative to the list's own directory or URL.
std::string RelativeTo(const std::string& list, const std::string& location) {
  if (IsHttpUrl(location) || IsMarkedPath(location) || absl::StartsWith(location, "/")) {
    return location;
  }
  if (IsArtifactReference(list)) return location;  // uploaded lists name absolute locations
  const size_t slash = list.rfind('/');
  if (slash == std::string::npos) return location;
  return absl::StrCat(list.substr(0, slash + 1), location);
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const std::string& what) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(what, " '", path, "': ", ec.message()));
  if (size > kMaxShardListBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", path, "' has ", size, " bytes; a shard list has at most ", kMaxShardListBytes));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::DataLossError(absl::StrCat(what, " '", path, "' cannot be read"));
  }
  return text.str();
}

std::string SpoolName(const ShardFetcher& fetcher, absl::string_view tag) {
  std::string dir = fetcher.spool_dir;
  if (dir.empty()) {
    std::error_code ec;
    dir = std::filesystem::temp_directory_path(ec).string();
    if (ec) dir = "/tmp";
  }
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat(dir, "/dtrain-spool-", getpid(), "-", counter.fetch_add(1), "-",
                      rng() % 1000000, "-", tag);
}

absl::Status InField(const std::string& field, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(field, ": ", s.message()));
}

absl::StatusOr<std::vector<ShardEntry>> ReadList(const std::string& location,
                                                 const ShardFetcher& fetcher,
                                                 const std::atomic<bool>* cancelled) {
  std::string text;
  if (IsHttpUrl(location)) {
    if (!fetcher.url) return absl::FailedPreconditionError("this worker cannot fetch URLs");
    const std::string spool = SpoolName(fetcher, "list.txt");
    absl::Status fetched =
        fetcher.url(location, spool, "", cancelled, fetcher.list_attempt_timeout, nullptr);
    if (fetched.ok()) {
      absl::StatusOr<std::string> read = ReadSmallFile(spool, "shard list");
      if (read.ok()) text = std::move(*read);
      fetched = read.status();
    }
    std::error_code ec;
    std::filesystem::remove(spool, ec);
    DTRAIN_RETURN_IF_ERROR(fetched);
  } else if (IsArtifactReference(location)) {
    if (!fetcher.artifact) {
      return absl::FailedPreconditionError("this worker has no artifact cache for uploaded files");
    }
    DTRAIN_ASSIGN_OR_RETURN(std::string path, fetcher.artifact(ArtifactDigest(location)));
    DTRAIN_ASSIGN_OR_RETURN(text, ReadSmallFile(path, "shard list"));
  } else {
    DTRAIN_ASSIGN_OR_RETURN(text, ReadSmallFile(WithoutWorkerMark(location), "shard list"));
  }
  return ParseShardList(text);
}

}  // namespace

absl::StatusOr<ShardCatalog> ResolveShards(const std::string& spec_value, const std::string& field,
                                           const ShardFetcher& fetcher,
                                           const std::atomic<bool>* cancelled) {
  if (spec_value.empty()) return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  std::vector<ShardEntry> entries;
  const bool url = IsHttpUrl(spec_value);
  const std::string local = WithoutWorkerMark(spec_value);
  std::error_code ec;
  if (NamesTarShards(spec_value) && !IsArtifactReference(spec_value)) {
    absl::StatusOr<std::vector<std::string>> names = ExpandShardPattern(spec_value);
    if (!names.ok()) return InField(field, names.status());
    for (std::string& n : *names) entries.push_back({std::move(n), "", -1});
  } else if (!url && !IsArtifactReference(spec_value) && std::filesystem::is_directory(local, ec)) {
    std::vector<std::string> names;
    for (std::filesystem::directory_iterator it(local, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::error_code type_error;
      if (it->is_regular_file(type_error) && NamesTarShards(name) && name[0] != '.') {
        names.push_back(name);
      }
      if (names.size() > kMaxShards) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": directory '", local, "' holds more than ", kMaxShards, " shards"));
      }
    }
    if (ec) {
      return absl::NotFoundError(
          absl::StrCat(field, ": directory '", local, "' cannot be listed: ", ec.message()));
    }
    std::sort(names.begin(), names.end());
    const std::string prefix = IsWorkerPath(spec_value) ? std::string(kWorkerPathPrefix) : "";
    const std::string dir = absl::EndsWith(local, "/") ? local : absl::StrCat(local, "/");
    for (const std::string& n : names) entries.push_back({absl::StrCat(prefix, dir, n), "", -1});
    if (entries.empty()) {
      return absl::NotFoundError(absl::StrCat(field, ": directory '", local,
                                              "' holds no tar shards (*.tar, *.tar.gz, *.tgz)"));
    }
  } else {
    absl::StatusOr<std::vector<ShardEntry>> list = ReadList(spec_value, fetcher, cancelled);
    if (!list.ok()) {
      return absl::Status(list.status().code(), absl::StrCat(field, ": shard list '", spec_value,
                                                             "': ", list.status().message()));
    }
    entries = std::move(*list);
    for (ShardEntry& e : entries) e.location = RelativeTo(spec_value, e.location);
  }
  ShardCatalog catalog;
  catalog.shards.reserve(entries.size());
  for (ShardEntry& e : entries) {
    int64_t samples = e.samples;
    if (samples < 0) {
      if (IsHttpUrl(e.location) || IsArtifactReference(e.location)) {
        return absl::FailedPreconditionError(absl::StrCat(
            field, ": shard '", e.location,
            "' has no sample count, and a remote shard is not read twice to count it; list the "
            "shards in a list file with 'samples:<n>' on each line (dtrain.data.write_shards "
            "writes one)"));
      }
      absl::StatusOr<int64_t> counted = CountTarSamples(WithoutWorkerMark(e.location));
      if (!counted.ok()) return InField(field, counted.status());
      samples = *counted;
    }
    catalog.samples += samples;
    catalog.shards.push_back({std::move(e.location), std::move(e.digest), samples});
  }
  return catalog;
}

namespace {

// Shards on a worker's disk whose digest was checked, by path, with the size and modification
// time they had: every epoch opens every shard again, and hashing a large dataset each epoch
// would read it twice. A file changed since (another size or time) is hashed again.
class VerifiedShards {
 public:
  static VerifiedShards& Global() {
    static VerifiedShards* v = new VerifiedShards();  // never destroyed: used by any thread
    return *v;
  }
  bool Verified(const std::string& path, const std::string& digest) {
    std::optional<Stamp> stamp = StampOf(path);
    if (!stamp) return false;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = verified_.find(path);
    return it != verified_.end() && it->second.first == *stamp && it->second.second == digest;
  }
  void Add(const std::string& path, const std::string& digest) {
    std::optional<Stamp> stamp = StampOf(path);
    if (!stamp) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (verified_.size() >= kMaxEntries) verified_.clear();  // bounded; it only costs a rehash
    verified_[path] = {*stamp, digest};
  }

 private:
  using Stamp = std::pair<uintmax_t, std::filesystem::file_time_type>;
  static constexpr size_t kMaxEntries = 1 << 20;
  static std::optional<Stamp> StampOf(const std::string& path) {
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) return std::nullopt;
    const auto time = std::filesystem::last_write_time(path, ec);
    if (ec) return std::nullopt;
    return Stamp{size, time};
  }
  std::mutex mu_;
  std::map<std::string, std::pair<Stamp, std::string>> verified_;
};

}  // namespace

absl::StatusOr<LocalShard> FetchShard(const CatalogShard& shard, const ShardFetcher& fetcher,
                                      const std::atomic<bool>* cancelled,
                                      std::atomic<int64_t>* received) {
  if (IsHttpUrl(shard.location)) {
    if (!fetcher.url) return absl::FailedPreconditionError("this worker cannot fetch URLs");
    const std::string spool = SpoolName(fetcher, "shard.tar");
    absl::Status s =
        fetcher.url(shard.location, spool, shard.digest, cancelled, absl::ZeroDuration(), received);
    if (!s.ok()) {
      std::error_code ec;
      std::filesystem::remove(spool, ec);
      return s;
    }
    return LocalShard{spool, true};
  }
  if (IsArtifactReference(shard.location)) {
    if (!fetcher.artifact) {
      return absl::FailedPreconditionError("this worker has no artifact cache for uploaded files");
    }
    DTRAIN_ASSIGN_OR_RETURN(std::string path, fetcher.artifact(ArtifactDigest(shard.location)));
    return LocalShard{std::move(path), false};
  }
  std::string path = WithoutWorkerMark(shard.location);
  if (!shard.digest.empty() && !VerifiedShards::Global().Verified(path, shard.digest)) {
    absl::StatusOr<std::string> digest = Sha256OfFile(path);
    if (!digest.ok()) return digest.status();
    if (*digest != shard.digest) {
      return absl::DataLossError(absl::StrCat("shard '", path, "' has digest ", *digest,
                                              ", the shard list says ", shard.digest));
    }
    VerifiedShards::Global().Add(path, shard.digest);
  }
  return LocalShard{std::move(path), false};
}

}  // namespace dtrain
