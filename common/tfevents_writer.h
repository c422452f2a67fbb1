// Writes TensorBoard event files: the TFRecord framing (length, masked CRC-32C of the length,
// the serialized Event, masked CRC-32C of it) around TfEvent messages (proto/dtrain/v1/
// tfevents.proto). CRC-32C is hand-written (a table-driven loop): Debian 12's Abseil predates
// absl/crc and zlib's crc32 is a different polynomial.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include <memory>

#include "absl/status/statusor.h"

namespace dtrain {

uint32_t Crc32c(const char* data, size_t size);
// TFRecord's masking: rotate right by 15 and add a constant.
uint32_t MaskedCrc32c(const char* data, size_t size);

class TfEventsWriter {
 public:
  // Creates <dir>/events.out.tfevents.<unix seconds>.<host> and writes the version record.
  static absl::StatusOr<std::unique_ptr<TfEventsWriter>> Create(const std::string& dir,
                                                                const std::string& host);
  absl::Status AddScalar(const std::string& tag, double value, int64_t step, double wall_time);
  absl::Status Flush();
  const std::string& path() const { return path_; }

 private:
  absl::Status WriteRecord(const std::string& data);
  std::string path_;
  std::ofstream out_;
};

}  // namespace dtrain
