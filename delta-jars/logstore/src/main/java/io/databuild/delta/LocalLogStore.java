package io.databuild.delta;

import io.delta.storage.HDFSLogStore;
import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.EnumSet;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.regex.Pattern;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CreateFlag;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileContext;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Options;
import org.apache.hadoop.fs.Path;

/**
 * Delta's log store for local disks (file:), with a listing whose cost follows the files it
 * returns rather than the folder's size.
 *
 * <p>Delta opens a table by listing its log from the newest checkpoint: {@code listFrom} must
 * return every file of the folder whose name sorts at or after the given one, sorted. The default
 * store for file: (HDFSLogStore) asks Hadoop for the status of every file in the folder, about a
 * tenth of a millisecond each, and keeps the few after the checkpoint. A log the JVM-free appends
 * grow by a commit file each holds tens of thousands of files an hour until the log's retention
 * cleans them up, so every snapshot Spark took of it cost seconds, growing all day. This store
 * reads the folder's names (one directory read, no file metadata), keeps those at or after the
 * start, and reads the size and time of each as the caller takes it: a log cleanup that stops
 * at the first file still kept reads no more.
 *
 * <p>A new file (a commit: {@code overwrite} false) is written whole to a temporary file, then
 * made visible under its name by a hard link, which the filesystem refuses when the name exists:
 * "write version N if absent" in one step, as delta-rs and the JVM-free appends do on a local
 * disk. HDFSLogStore checks that the name is free, then renames, and a rename on a local disk
 * replaces what another process committed between the two. With every writer committing by a
 * hard link, Spark needs no lock against the appends to commit safely
 * (docs/decisions/0055-spark-commits-a-local-table-by-hard-link.md). Overwrites are
 * HDFSLogStore's.
 *
 * <pre>spark.delta.logStore.file.impl=io.databuild.delta.LocalLogStore</pre>
 */
public class LocalLogStore extends HDFSLogStore {

  public LocalLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    if (overwrite) {
      super.write(path, actions, true, hadoopConf);
      return;
    }
    FileContext fc = FileContext.getFileContext(path.toUri(), hadoopConf);
    Path temporary = createTempPath(path);
    // Through Hadoop, as HDFSLogStore writes: the lake's umask (fs.permissions.umask-mode) holds.
    try {
      try (FSDataOutputStream stream =
          fc.create(
              temporary,
              EnumSet.of(CreateFlag.CREATE),
              Options.CreateOpts.checksumParam(Options.ChecksumOpt.createDisabled()))) {
        while (actions.hasNext()) {
          stream.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
      }
      Files.createLink(localFile(path).toPath(), localFile(temporary).toPath());
    } catch (FileAlreadyExistsException taken) {
      throw new FileAlreadyExistsException(path.toString()); // Delta's cue to check and retry
    } finally {
      fc.delete(temporary, false);
    }
  }

  private static File localFile(Path path) {
    return new File(Path.getPathWithoutSchemeAndAuthority(path).toUri().getPath());
  }

  private static final Pattern COMMIT = Pattern.compile("\\d{20}\\.json");

  // A listing race leaves a version or a few out; a longer run of missing versions is a damaged
  // log, which Delta reports as it is.
  private static final int MISSED_COMMITS_CHECKED = 1_000;

  /**
   * {@code listed} and every commit file (N.json) between the oldest and the newest listed one
   * that the read of the folder missed but that is there. A directory read is no snapshot: on
   * ext4, whose entries are read in hash order, a commit linked while the read is under way may
   * be missed while the next one, linked after it, is returned, and Delta refuses a log whose
   * versions have a gap (DELTA_VERSIONS_NOT_CONTIGUOUS: seen in bench.soak, a bin-pack's commit
   * failing while the appends committed). Commit files are removed oldest first (a log
   * cleanup), never from between two kept ones, so a version missing between two listed ones
   * is one the read missed; if it is not there either, the gap stays for Delta to report.
   */
  static String[] withMissedCommits(File directory, String[] listed) {
    long[] versions =
        Arrays.stream(listed)
            .filter(name -> COMMIT.matcher(name).matches())
            .mapToLong(name -> Long.parseLong(name.substring(0, 20)))
            .sorted()
            .toArray();
    List<String> names = new ArrayList<>(Arrays.asList(listed));
    for (int i = 1; i < versions.length; i++) {
      if (versions[i] - versions[i - 1] - 1 > MISSED_COMMITS_CHECKED) {
        continue;
      }
      for (long version = versions[i - 1] + 1; version < versions[i]; version++) {
        String name = String.format("%020d.json", version);
        if (new File(directory, name).exists()) {
          names.add(name);
        }
      }
    }
    return names.toArray(new String[0]);
  }

  @Override
  public Iterator<FileStatus> listFrom(Path path, Configuration hadoopConf) throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    Path folder = fs.makeQualified(path.getParent());
    File directory = localFile(folder);
    String[] names = directory.list();
    if (names == null) {
      throw new FileNotFoundException("No such file or directory: " + folder);
    }
    String start = path.getName();
    String[] atOrAfter = Arrays.stream(names).filter(name -> name.compareTo(start) >= 0).toArray(String[]::new);
    Iterator<String> after = Arrays.stream(withMissedCommits(directory, atOrAfter)).sorted().iterator();
    long blockSize = fs.getDefaultBlockSize(folder);
    return new Iterator<FileStatus>() {
      private FileStatus next = advance();

      private FileStatus advance() {
        while (after.hasNext()) {
          String name = after.next();
          File file = new File(directory, name);
          long modified = file.lastModified(); // 0 once the file is gone
          if (modified != 0L) {
            return new FileStatus(
                file.length(), file.isDirectory(), 1, blockSize, modified, new Path(folder, name));
          }
          // removed since the folder was read (a log cleanup): a listing taken now would not hold it
        }
        return null;
      }

      @Override
      public boolean hasNext() {
        return next != null;
      }

      @Override
      public FileStatus next() {
        if (next == null) {
          throw new NoSuchElementException();
        }
        FileStatus current = next;
        next = advance();
        return current;
      }
    };
  }
}
