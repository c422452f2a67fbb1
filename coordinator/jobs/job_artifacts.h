// Which stored files (artifact digests) a job names: the uploads its spec refers to by content,
// the checkpoint it resumes from and the files it kept. The coordinator frees a stored file only
// when no job names it, and lets a job's workers fetch only what their job names.
#ifndef DTRAIN_COORDINATOR_JOBS_JOB_ARTIFACTS_H_
#define DTRAIN_COORDINATOR_JOBS_JOB_ARTIFACTS_H_

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/jobs/job_record.h"
#include "dtrain/v1/jobs.pb.h"

namespace dtrain {

// The files a spec names by content, with the field naming each.
std::vector<std::pair<std::string, std::string>> SpecArtifacts(const v1::JobSpec& spec);

// Every stored file `job` names: its spec's uploads, where it resumes from, the files it kept.
std::set<std::string> DigestsNamedBy(const JobRecord& job);

}  // namespace dtrain

#endif  // DTRAIN_COORDINATOR_JOBS_JOB_ARTIFACTS_H_
