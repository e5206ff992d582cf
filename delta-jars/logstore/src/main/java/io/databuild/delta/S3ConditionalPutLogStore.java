package io.databuild.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * A Delta LogStore for S3 that writes commit N with S3's conditional write (If-None-Match: *), so
 * that creating a commit file is atomic put-if-absent against every other writer of the table:
 * Spark drivers in other processes and delta-rs, which commits the same way.
 *
 * <p>Delta's default for s3a:// (S3SingleDriverLogStore) checks existence in the JVM and then
 * overwrites, safe within one driver only. S3A of Hadoop 3.5 sends the condition for a file built
 * with the option fs.option.create.conditional.overwrite; a commit that loses the race gets S3's
 * 412, which is Delta's FileAlreadyExistsException: Delta checks for conflicts and tries N + 1.
 * S3's listing is strongly consistent, so listFrom needs no cache.
 *
 * <pre>spark.delta.logStore.s3a.impl=io.databuild.delta.S3ConditionalPutLogStore</pre>
 */
public class S3ConditionalPutLogStore extends HadoopFileSystemLogStore {
  static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

  public S3ConditionalPutLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
      throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    var builder = fs.createFile(path).overwrite(overwrite);
    if (!overwrite) {
      builder.must(CONDITIONAL_CREATE, true);
    }
    try (FSDataOutputStream stream = builder.build()) {
      while (actions.hasNext()) {
        stream.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
      }
    } catch (IOException error) {
      if (!overwrite && lostTheRace(error)) {
        throw new FileAlreadyExistsException(path.toString());
      }
      throw error;
    }
  }

  /** Whether `error` (or a cause) is the store refusing the write because the file exists. */
  static boolean lostTheRace(Throwable error) {
    for (Throwable cause = error; cause != null; cause = cause.getCause()) {
      String name = cause.getClass().getName();
      String message = String.valueOf(cause.getMessage());
      if (cause instanceof org.apache.hadoop.fs.FileAlreadyExistsException
          || cause instanceof FileAlreadyExistsException
          || name.endsWith("RemoteFileChangedException")
          // the SDK's message for S3's answer; not a bare "412", which a commit file's name can hold
          || message.contains("Status Code: 412")
          || message.contains("PreconditionFailed")) {
        return true;
      }
    }
    return false;
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return false; // an object appears whole when its upload completes
  }
}
