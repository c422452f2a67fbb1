// A job's metric files on disk: metrics.csv in Lightning's CSVLogger shape (one column per
// metric, a row per step, a new metric rewriting the header, a file from before a coordinator
// restart continued, the older long format converted) and hparams.yaml (the resolved spec, read
// back with a YAML parser).
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/csv_cell.h"
#include "common/job_spec.h"
#include "coordinator/jobs/csv_metrics_file.h"
#include "coordinator/jobs/hparams_file.h"

namespace dtrain {
namespace metrics_files_test {

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/metrics-files-", getpid(), "-", name);
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(CsvMetricsFile, OneColumnPerMetric_OneRowPerStep_SortedLikeLightning) {
  std::string note;  // what the job log would say: nothing here
  const std::string path = TempPath("wide.csv");
  auto file = CsvMetricsFile::Open(path, /*append=*/false, &note);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(Read(path), "epoch,step\n");
  ASSERT_TRUE((*file)->Add("train_loss", 2.5, 10, 0, &note).ok());
  ASSERT_TRUE((*file)->Add("train_acc", 0.25, 10, 0, &note).ok());  // joins step 10's row
  ASSERT_TRUE((*file)->Add("train_loss", 1.5, 20, 0, &note).ok());
  ASSERT_TRUE((*file)->Add("val_acc", 0.5, 20, 0, &note).ok());  // a new column: header rewritten
  ASSERT_TRUE((*file)->Add("train_loss", 1.25, 20, 1, &note).ok());  // step 20 has one: a new row
  EXPECT_EQ(Read(path),
            "epoch,step,train_acc,train_loss,val_acc\n"
            "0,10,0.25,2.5,\n"
            "0,20,,1.5,0.5\n"
            "1,20,,1.25,\n");
  file->reset();

  // A restarted coordinator goes on with the same file.
  auto again = CsvMetricsFile::Open(path, /*append=*/true, &note);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->Add("train_loss", 1.0, 30, 1, &note).ok());
  EXPECT_EQ(Read(path),
            "epoch,step,train_acc,train_loss,val_acc\n"
            "0,10,0.25,2.5,\n"
            "0,20,,1.5,0.5\n"
            "1,20,,1.25,\n"
            "1,30,,1,\n");
}

// Names come from model code (self.log): one that would start a formula in a spreadsheet, or
// holds a comma or a quote, is guarded and quoted, and reads back whole after a restart.
TEST(CsvMetricsFile, HostileMetricNames_GuardedQuoted_ReadBackWhole) {
  std::string note;  // what the job log would say: nothing here
  const std::string path = TempPath("hostile.csv");
  auto file = CsvMetricsFile::Open(path, /*append=*/false, &note);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Add("=HYPERLINK(\"http://x\",\"a\")", 1.5, 1, 0, &note).ok());
  ASSERT_TRUE((*file)->Add("-loss", -0.5, 1, 0, &note).ok());
  ASSERT_TRUE((*file)->Add("a,b", 2, 1, 0, &note).ok());
  EXPECT_EQ(Read(path),
            "'-loss,\"'=HYPERLINK(\"\"http://x\"\",\"\"a\"\")\",\"a,b\",epoch,step\n"
            "-0.5,1.5,2,0,1\n");
  file->reset();
  auto again = CsvMetricsFile::Open(path, /*append=*/true, &note);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->Add("-loss", -0.25, 2, 0, &note).ok());
  EXPECT_EQ(Read(path),
            "'-loss,\"'=HYPERLINK(\"\"http://x\"\",\"\"a\"\")\",\"a,b\",epoch,step\n"
            "-0.5,1.5,2,0,1\n"
            "-0.25,,,0,2\n");
}

TEST(CsvCell, GuardsFormulasQuotesSeparators_AndSplitsBack) {
  EXPECT_EQ(CsvCell("val_loss"), "val_loss");
  EXPECT_EQ(CsvCell("+1"), "'+1");
  EXPECT_EQ(CsvCell("@SUM(A1)"), "'@SUM(A1)");
  EXPECT_EQ(CsvCell("'quoted"), "''quoted");
  EXPECT_EQ(CsvCell("say \"hi\""), "\"say \"\"hi\"\"\"");
  const std::vector<std::string> names = {"plain", "=1+2", "a,b", "x\"y", "'q", "-", ""};
  std::string line;
  for (const std::string& n : names) line += (line.empty() ? "" : ",") + CsvCell(n);
  EXPECT_EQ(SplitCsvLine(line), names);
  EXPECT_EQ(SplitCsvLine("1,,-0.5"), (std::vector<std::string>{"1", "", "-0.5"}));
}

TEST(CsvMetricsFile, OlderLongFormat_ConvertedWhenContinued) {
  std::string note;  // what the job log would say: nothing here
  const std::string path = TempPath("long.csv");
  std::ofstream(path) << "wall_time,step,epoch,name,value\n"
                         "1.0,5,0,train_loss,2\n"
                         "1.1,5,0,val_acc,0.5\n"
                         "1.2,9,1,train_loss,1\n"
                         "1.3,9";  // cut short by a crash
  auto file = CsvMetricsFile::Open(path, /*append=*/true, &note);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(Read(path),
            "epoch,step,train_loss,val_acc\n"
            "0,5,2,0.5\n"
            "1,9,1,\n");
}

// A name that holds a line break is one quoted cell: a new column reads the rows back from the
// file, and so does a restart, and neither splits that row in two.
TEST(CsvMetricsFile, NameWithALineBreak_SurvivesANewColumnAndARestart) {
  const std::string path = TempPath("linebreak.csv");
  std::string note;
  auto file = CsvMetricsFile::Open(path, /*append=*/false, &note);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Add("a\nb", 1, 1, 0, &note).ok());
  ASSERT_TRUE((*file)->Add("a\nb", 2, 2, 0, &note).ok());
  ASSERT_TRUE((*file)->Add("c", 3, 2, 0, &note).ok());  // a new column: read back, rewritten
  const std::string want =
      "\"a\nb\",c,epoch,step\n"
      "1,,0,1\n"
      "2,3,0,2\n";
  EXPECT_EQ(Read(path), want);
  file->reset();
  auto again = CsvMetricsFile::Open(path, /*append=*/true, &note);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(Read(path), want);
  EXPECT_EQ(note, "");
}

// Past its bound a file is not read back, on a restart or for a new column: it is kept beside
// under the next free number, the note says where, and a new file goes on from there.
TEST(CsvMetricsFile, PastItsBound_KeptBesideAndANewFileContinues) {
  const std::string dir = TempPath("bound");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/metrics.csv";
  std::string note;
  auto file = CsvMetricsFile::Open(path, /*append=*/false, &note, /*most_bytes=*/39);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE((*file)->Add("loss", 1, 1, 0, &note).ok());
  ASSERT_TRUE((*file)->Add("loss", 2, 2, 0, &note).ok());
  ASSERT_TRUE((*file)->Add("loss", 3, 3, 0, &note).ok());  // 16 + 3 * 6 = 34 bytes
  ASSERT_TRUE((*file)->Add("loss", 4, 4, 0, &note).ok());  // 40: the next new column keeps it
  EXPECT_EQ(note, "");
  std::ofstream(dir + "/metrics.1.csv") << "taken\n";  // a number already used is skipped
  ASSERT_TRUE((*file)->Add("acc", 0.5, 4, 0, &note).ok());
  EXPECT_THAT(note, ::testing::HasSubstr("had grown to 40 bytes, more than the 39"));
  EXPECT_THAT(note, ::testing::HasSubstr("kept as '" + dir + "/metrics.2.csv'"));
  EXPECT_EQ(Read(dir + "/metrics.1.csv"), "taken\n");
  EXPECT_EQ(Read(dir + "/metrics.2.csv"), "epoch,loss,step\n0,1,1\n0,2,2\n0,3,3\n0,4,4\n");
  // The new file starts with the whole of step 4's row, the value that made it included.
  EXPECT_EQ(Read(path), "acc,epoch,loss,step\n0.5,0,4,4\n");
  // A restart that finds a file past the bound does not read it.
  file->reset();
  std::ofstream(path, std::ios::app) << std::string(64, '9') << "\n";
  note.clear();
  auto again = CsvMetricsFile::Open(path, /*append=*/true, &note, /*most_bytes=*/39);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(note, ::testing::HasSubstr("kept as '" + dir + "/metrics.3.csv'"));
  EXPECT_EQ(Read(path), "epoch,step\n");
  ASSERT_TRUE((*again)->Add("acc", 0.75, 5, 0, &note).ok());
  EXPECT_EQ(Read(path), "acc,epoch,step\n0.75,0,5\n");
  std::filesystem::remove_all(dir);
}

TEST(MetricsCsv, WrittenTwice_ReadsTheSame_LongFormNamesEndAtLineBreaks) {
  // The older long form wrote names unquoted: a quote in one does not swallow the lines after.
  const std::string text =
      "wall_time,step,epoch,name,value\n1,5,0,\"a,b\",0.1\n1,5,0,x,1e300\n1,6,0,x,nan\n"
      "1,7,0,say \"hi,2\n1,8,0,x,3\n";
  const MetricsCsvText once = RewriteMetricsCsv(text);
  EXPECT_EQ(once.text, "\"a,b\",epoch,step,x\n0.1,0,5,1e+300\n,0,6,nan\n,0,8,3\n");
  EXPECT_EQ(RewriteMetricsCsv(once.text).text, once.text);
  ASSERT_TRUE(once.last.has_value());
  EXPECT_EQ(once.last->step, 8);
  EXPECT_EQ(once.text.substr(once.last_row_offset), ",0,8,3\n");
}

// What metrics.csv holds, kept the plain way it was before: every row in memory, the whole
// text written after each value.
struct MetricsModel {
  std::vector<std::string> columns = {"epoch", "step"};
  std::vector<MetricsCsvRow> rows;
  void Add(const std::string& name, double value, int64_t step, int64_t epoch) {
    if (std::find(columns.begin(), columns.end(), name) == columns.end()) {
      columns.push_back(name);
      std::sort(columns.begin(), columns.end());
    }
    if (!rows.empty() && rows.back().step == step && rows.back().values.count(name) == 0) {
      rows.back().values[name] = value;
      rows.back().epoch = epoch;
    } else {
      rows.push_back(MetricsCsvRow{step, epoch, {{name, value}}});
    }
  }
  std::string Text() const {
    std::string text;
    for (const std::string& c : columns) text += (text.empty() ? "" : ",") + CsvCell(c);
    text += "\n";
    for (const MetricsCsvRow& row : rows) text += MetricsCsvLine(columns, row);
    return text;
  }
};

// The file against the plain model it replaced (every row in memory, the whole text written
// after each value): the same text after every one of 600 values, new columns, repeated steps
// and a restart included.
TEST(CsvMetricsFile, EveryValue_TheSameFileAsKeepingEveryRowInMemory) {
  MetricsModel model;
  const std::string path = TempPath("model.csv");
  std::string note;
  auto file = CsvMetricsFile::Open(path, /*append=*/false, &note);
  ASSERT_TRUE(file.ok()) << file.status();
  std::mt19937 random(11);
  const std::vector<std::string> names = {"train_loss", "val_acc", "lr-SGD", "a,b", "-x", "n\nl"};
  int64_t step = 0;
  for (int i = 0; i < 600; ++i) {
    // New names come in over time; a step repeats a third of the time.
    const std::string& name = names[random() % std::min<size_t>(names.size(), 1 + i / 60)];
    if (random() % 3 != 0) ++step;
    const double value = static_cast<double>(random() % 1000) / 7;
    const int64_t epoch = step / 50;
    model.Add(name, value, step, epoch);
    ASSERT_TRUE((*file)->Add(name, value, step, epoch, &note).ok()) << i;
    ASSERT_EQ(Read(path), model.Text()) << "after value " << i;
    if (i == 300) {  // a coordinator restart
      file->reset();
      file = CsvMetricsFile::Open(path, /*append=*/true, &note);
      ASSERT_TRUE(file.ok()) << file.status();
    }
  }
  EXPECT_EQ(note, "");
}

// A write that fails (the file size limit, here) leaves the rows before it whole. A row it left
// unfinished is written again, by the next value or when the file is closed; a column that
// could not be added leaves the file as it was.
// In a child process: its file size limit is the fault.
void FailedWritesInAChild() {
  ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
  const std::string path = TempPath("failing.csv");
  MetricsModel model;
  std::string note;
  std::unique_ptr<CsvMetricsFile> file;
  auto open = [&](bool append) {
    auto opened = CsvMetricsFile::Open(path, append, &note);
    if (opened.ok()) file = std::move(*opened);
    return opened.ok();
  };
  // `kept`: whether the file must keep the value (the model does too).
  auto add = [&](const std::string& name, double value, int64_t step, bool kept) {
    if (kept) model.Add(name, value, step, 0);
    return file->Add(name, value, step, 0, &note).ok();
  };
  auto limit = [](uintmax_t bytes) {
    rlimit r{static_cast<rlim_t>(bytes), RLIM_INFINITY};
    ::setrlimit(RLIMIT_FSIZE, &r);
  };
  auto size = [&] { return std::filesystem::file_size(path); };
  int failed = 0;
  auto check = [&](bool holds) { failed = failed * 10 + (holds ? 0 : 1); };
  check(open(false) && add("a", 1, 1, true) && add("b", 2, 1, true) && add("a", 3, 2, true));
  const uintmax_t before = size();
  limit(before + 4);  // an appended row gets 4 of its bytes
  check(!add("a", 4, 3, true) && size() == before + 4);
  limit(RLIM_INFINITY);
  check(add("a", 5, 4, true) && Read(path) == model.Text());  // row 3 written again
  limit(size());                                              // step 4's line rewritten longer
  check(!add("b", 6, 4, true));
  limit(RLIM_INFINITY);
  file.reset();  // closing writes the unfinished row
  check(Read(path) == model.Text());
  check(open(true));
  const std::string whole = Read(path);
  limit(size());
  check(!add("c", 7, 5, false) && Read(path) == whole);  // the new column: nothing changes
  limit(RLIM_INFINITY);
  check(add("a", 8, 5, true) && Read(path) == model.Text());
  std::fprintf(stderr, "checks %d\n", failed);
  std::_Exit(failed == 0 ? 0 : 1);
}

TEST(CsvMetricsFile, FailedWrites_LoseNoWholeRow_TheUnfinishedOneWrittenAgain) {
  EXPECT_EXIT(FailedWritesInAChild(), ::testing::ExitedWithCode(0), "checks 0");
}

TEST(MetricsCsv, ALastLineWithoutItsBreak_IsNotARow) {
  // Cut inside its step cell by a crash: "0,4,1234" would read as step 12.
  const MetricsCsvText read = RewriteMetricsCsv("epoch,loss,step\n0,0.5,1\n0,4,12");
  EXPECT_EQ(read.text, "epoch,loss,step\n0,0.5,1\n");
  ASSERT_TRUE(read.last.has_value());
  EXPECT_EQ(read.last->step, 1);
  EXPECT_EQ(RewriteMetricsCsv("epoch,step").text, "epoch,step\n");
}

TEST(HparamsFile, ResolvedSpec_AsBlockYamlThatParsesBack) {
  v1::JobSpec spec;
  spec.set_name("hp");
  spec.mutable_model()->set_builtin("mlp");
  spec.mutable_data()->set_tensors_file("/data/x.pt");
  spec.mutable_data()->mutable_normalize()->add_mean(0.5);
  spec.mutable_data()->mutable_normalize()->add_mean(0.25);
  spec.mutable_data()->mutable_normalize()->add_std(0.125);
  spec.mutable_data()->mutable_normalize()->add_std(0.5);
  spec.mutable_trainer()->set_precision("32");
  spec.mutable_optimizer()->set_lr(0.05);
  spec.mutable_optimizer()->set_weight_decay(1e-5);
  ASSERT_TRUE(NormalizeJobSpec(&spec).ok());
  const std::string path = TempPath("hparams.yaml");
  ASSERT_TRUE(WriteHparamsFile(path, spec).ok());
  const YAML::Node yaml = YAML::LoadFile(path);
  EXPECT_EQ(yaml["name"].as<std::string>(), "hp");
  EXPECT_EQ(yaml["trainer"]["max_epochs"].as<int>(), spec.trainer().max_epochs());
  EXPECT_EQ(yaml["trainer"]["precision"].as<std::string>(), spec.trainer().precision());
  EXPECT_EQ(yaml["data"]["batch_size"].as<int>(), 32) << "the defaults are filled in";
  EXPECT_EQ(yaml["data"]["normalize"]["mean"][1].as<double>(), 0.25);
  EXPECT_EQ(yaml["optimizer"]["lr"].as<double>(), spec.optimizer().lr());
  // Floats at the fewest digits that read back exactly, each a float to YAML 1.1 (PyYAML).
  EXPECT_THAT(Read(path), ::testing::HasSubstr("  lr: 0.05\n"));
  EXPECT_THAT(Read(path), ::testing::HasSubstr("  weight_decay: 1.0e-05\n"));
  EXPECT_THAT(Read(path), ::testing::HasSubstr("mean: [0.5, 0.25]"));
  EXPECT_THAT(Read(path), ::testing::HasSubstr("trainer:\n  "))
      << "block style, as a person would write it";
}

// The model's values come from workers as text: each is parsed, and only what
// save_hyperparameters() records (a quoted string, a number or bool, a list of them; untagged)
// joins the file, written again by dtrain: no tag (PyYAML's unsafe load would run
// !!python/object), no anchor or alias expanded, no mapping, no name twice, no number PyYAML
// refuses. Strings, the spec's too, are escaped
// beyond ASCII, so that PyYAML (which refuses a raw DEL and breaks lines at U+2028) reads it.
TEST(HparamsFile, ModelValuesParsedCheckedAndWrittenAgain_EscapedToAscii) {
  // 350 bytes of anchors and aliases that name 10^8 zeros: refused, not expanded.
  std::string laughs = "[&a [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]";
  for (char name = 'b'; name <= 'h'; ++name) {
    laughs += absl::StrCat(", &", std::string(1, name), " [");
    for (int i = 0; i < 10; ++i) {
      laughs += absl::StrCat(i == 0 ? "" : ", ", "*", std::string(1, name - 1));
    }
    laughs += "]";
  }
  laughs += "]";
  v1::JobSpec spec;
  spec.set_name("caf\xc3\xa9 \x7f \xe2\x80\xa8 end");
  const std::string path = TempPath("hparams-model.yaml");
  std::vector<std::string> left_out;
  ASSERT_TRUE(WriteHparamsFile(path, spec,
                               {{"lr", "0.05"},
                                {"bad name", "1"},
                                {"raw_utf8", "\"caf\xc3\xa9\""},
                                {"raw_del", "\"a\x7f\""},
                                {"two_lines", "1\n2"},
                                {"broken", "[1, 2"},
                                {"a_map", "{a: 1}"},
                                {"a_null", "~"},
                                {"tagged", "!!python/object/apply:os.system [\"id\"]"},
                                {"tagged_item", "[1, !!binary aGk=]"},
                                {"octal", "012"},
                                {"big", std::string(5000, '9')},
                                {"expanded", laughs},
                                {"alias", "[1, *a]"},
                                {"sizes", "- 32\n- 10"},
                                {"tiny", "1.0e-05"},
                                {"lr", "1"},
                                {"on", "'x'"},
                                {"anchored", "&a 7"}},
                               &left_out)
                  .ok());
  // Each value left out is named in the job's log, with why; none of those kept is.
  ASSERT_EQ(left_out.size(), 12u) << absl::StrJoin(left_out, "\n");
  EXPECT_EQ(left_out[0],
            "hparams.yaml leaves out hyperparameter \"bad name\": its name is not a Python "
            "identifier");
  EXPECT_THAT(left_out[2], ::testing::StartsWith("hparams.yaml leaves out hyperparameter "
                                                 "\"broken\": its value is not YAML ("));
  EXPECT_THAT(left_out[4], ::testing::StartsWith("hparams.yaml leaves out hyperparameter "
                                                 "\"a_null\": its value is not one "
                                                 "save_hyperparameters() records"));
  EXPECT_EQ(left_out[11],
            "hparams.yaml leaves out hyperparameter \"lr\": the workers reported the name "
            "twice; the first value is kept");
  const std::string text = Read(path);
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    EXPECT_TRUE(c == '\n' || (byte >= 0x20 && byte < 0x7f)) << "byte " << int{byte} << " in\n"
                                                            << text;
  }
  EXPECT_THAT(text, ::testing::HasSubstr("hyper_parameters:\n  lr: 0.05\n"));
  EXPECT_THAT(text, ::testing::HasSubstr(
                        "  sizes: [32, 10]\n  tiny: 1.0e-05\n  \"on\": \"x\"\n  anchored: 7\n"));
  const YAML::Node yaml = YAML::LoadFile(path);
  EXPECT_EQ(yaml["name"].as<std::string>(), spec.name()) << "escaped, read back as it was";
  const YAML::Node model = yaml["hyper_parameters"];
  std::vector<std::string> names;
  for (const auto& entry : model) names.push_back(entry.first.as<std::string>());
  EXPECT_THAT(names, ::testing::ElementsAre("lr", "raw_utf8", "raw_del", "sizes", "tiny", "on",
                                            "anchored"));
  EXPECT_EQ(model["raw_utf8"].as<std::string>(), "caf\xc3\xa9");
  EXPECT_EQ(model["raw_del"].as<std::string>(), "a\x7f");
  EXPECT_EQ(model["sizes"][1].as<int>(), 10);
}

// The job's log names what hparams.yaml leaves out: worker text C-escaped and cut at 64 bytes,
// the first 20 values by name, the rest counted.
TEST(HparamsFile, LeftOutValues_NamedEscapedAndCutShort_ThenCounted) {
  ModelHyperParameters model = {{std::string(70, 'x') + "-", "1"}};
  for (int i = 0; i < 25; ++i) model.emplace_back(absl::StrCat("bad\nname", i), "1");
  model.emplace_back("kept", "2");
  std::vector<std::string> left_out;
  const std::string text = HparamsYaml(v1::JobSpec(), model, &left_out);
  ASSERT_EQ(left_out.size(), 21u) << absl::StrJoin(left_out, "\n");
  EXPECT_EQ(left_out[0],
            absl::StrCat("hparams.yaml leaves out hyperparameter \"", std::string(64, 'x'),
                         "...\": its name is not a Python identifier"));
  EXPECT_EQ(left_out[1],
            "hparams.yaml leaves out hyperparameter \"bad\\nname0\": its name is not a Python "
            "identifier");
  EXPECT_EQ(left_out[20], "hparams.yaml leaves out 6 more hyperparameters, not named here");
  EXPECT_THAT(text, ::testing::HasSubstr("hyper_parameters:\n  kept: 2\n"));
}

}  // namespace metrics_files_test
}  // namespace dtrain
